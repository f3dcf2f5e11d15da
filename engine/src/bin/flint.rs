//! The `flint` binary: parses the command line and maps errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use flint_engine::cli::{dispatch, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    flint_engine::cli::logging::init();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
