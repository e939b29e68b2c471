//! The `taskd` binary: thin over the library (see `taskd::cli`).

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    taskd::cli::main()
}
