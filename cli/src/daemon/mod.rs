//! `chio supervisor serve` (the daemon itself is `chio_supervisor::daemon`) and the
//! `--supervisor` client of `chio cage run` and `chio repository`.

pub mod client;
mod passed;

use std::path::PathBuf;

use anyhow::Result;
use chio_supervisor::daemon::{self, ServeOptions, DEFAULT_SOCKET};
use clap::{Args, Subcommand};

/// `chio supervisor …`.
#[derive(Debug, Subcommand)]
pub enum SupervisorCommand {
    /// Run the supervisor daemon in the foreground (systemd: Type=notify).
    #[command(
        after_help = "Example:\n  chio supervisor serve --socket /run/chio/supervisor.sock --config /etc/chio/supervisor.json"
    )]
    Serve(ServeArgs),
}

/// Flags of `chio supervisor serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The Unix socket to listen on (mode 0660, group chio when that group exists).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The daemon's configuration (default /etc/chio/supervisor.json when it exists; without
    /// one only root may connect and launches are not receipted).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// State directory: imported images, the receipt store (default $CHIO_STATE_DIR or /var/lib/chio).
    #[arg(long = "state-dir", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// Run `chio supervisor …`.
pub fn run(cmd: &SupervisorCommand) -> Result<i32> {
    match cmd {
        SupervisorCommand::Serve(a) => {
            let options =
                ServeOptions { socket: a.socket.clone(), config: a.config.clone(), state_dir: a.state_dir.clone() };
            Ok(daemon::serve(&options)?)
        }
    }
}
