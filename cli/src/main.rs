//! The `chio` command.

mod cage_cmd;
mod units;

use clap::{Parser, Subcommand};

/// chio: a Linux-native sandbox supervisor with verified launches.
#[derive(Debug, Parser)]
#[command(name = "chio", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Native cage launches.
    Cage {
        #[command(subcommand)]
        command: CageCommand,
    },
}

#[derive(Debug, Subcommand)]
enum CageCommand {
    /// Run a command in a cage and report how it was confined and how it ended.
    Run(cage_cmd::RunArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match &cli.command {
        Command::Cage { command: CageCommand::Run(args) } => cage_cmd::run(args),
    };
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("chio: {e:#}");
            std::process::exit(125);
        }
    }
}
