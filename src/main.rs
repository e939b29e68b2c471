//! The `taskd` binary: thin over the library (see `taskd::cli`).

fn main() -> std::process::ExitCode {
    taskd::cli::main()
}
