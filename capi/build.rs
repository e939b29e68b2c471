//! The shared object names itself `libtaskd.so` (its SONAME), whatever file it is copied to:
//! C programs linked against it and the Python package load it by that name.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtaskd.so");
}
