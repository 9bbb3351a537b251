//! `chio supervisor serve` (the daemon itself is `chio_supervisor::daemon`) and the
//! `--supervisor` client of `chio cage run` and `chio repository`.

pub mod client;
mod passed;

use std::path::PathBuf;

use anyhow::Result;
use chio_supervisor::daemon::log::LogFormat;
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
    /// How it logs: journal (the journal's fields: CHIO_OUTCOME, CHIO_REASON, CHIO_REQUEST_ID,
    /// …), text or json lines on stderr; auto: journal when stderr is the journal's stream
    /// (under systemd), text otherwise.
    #[arg(long = "log-format", value_name = "FORMAT", default_value = "auto", value_parser = LogFormat::NAMES)]
    pub log_format: String,
}

/// Run `chio supervisor …`.
pub fn run(cmd: &SupervisorCommand) -> Result<i32> {
    match cmd {
        SupervisorCommand::Serve(a) => {
            // (clap has checked the name against the list.)
            let log_format = LogFormat::parse(&a.log_format).unwrap_or(LogFormat::Auto);
            let options = ServeOptions {
                socket: a.socket.clone(),
                config: a.config.clone(),
                state_dir: a.state_dir.clone(),
                log_format,
            };
            Ok(daemon::serve(&options)?)
        }
    }
}
