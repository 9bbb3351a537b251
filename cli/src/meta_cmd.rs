//! What packaging and operators need from the command line itself: shell completions, man pages
//! (both generated from the clap definitions) and a parse-only check of a command line (the
//! packaging test runs every unit's `ExecStart*` through it).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use chio_supervisor::daemon::wire::{Fds, Protocol, Request};
use chio_supervisor::repository::operation::Operation;
use clap::{Command, Subcommand};

use crate::cage_cmd::RunArgs;

/// `chio internal …` (hidden: for packaging and its tests).
#[derive(Debug, Subcommand)]
pub enum InternalCommand {
    /// Write a man page for chio and each subcommand into DIR.
    Man {
        /// The directory (created).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Parse a chio command line without running it: exit 0 when it parses, 2 (with clap's
    /// message) when not.
    Parse {
        /// The arguments after `chio`.
        #[arg(last = true, value_name = "ARGS")]
        args: Vec<OsString>,
    },
    /// Print the daemon request (one `chio.supervisor.v2` line) that `chio cage run ARGS` or
    /// `chio repository ARGS` with `--supervisor` would send, without sending it: for clients
    /// written in other languages, and to read what a command line asks of the daemon.
    Request {
        /// The request's id.
        #[arg(long, default_value = "1")]
        id: String,
        /// Announce the client's working directory among the descriptors (as `--supervisor`
        /// clients do; an admin's relative paths resolve in it).
        #[arg(long)]
        cwd: bool,
        /// `cage run …` or `repository …`.
        #[arg(last = true, value_name = "ARGS", required = true)]
        args: Vec<OsString>,
    },
}

/// Print the completion script for `shell`.
pub fn completions(cmd: &mut Command, shell: clap_complete::Shell) -> Result<i32> {
    // Into memory first: a closed pipe (`| head`) is an error to report, not a panic.
    let mut script = Vec::new();
    clap_complete::generate(shell, cmd, "chio", &mut script);
    std::io::Write::write_all(&mut std::io::stdout(), &script).context("writing the completion script")?;
    Ok(0)
}

/// Run an internal command against the full command tree `cmd`.
pub fn internal(cmd: Command, c: &InternalCommand) -> Result<i32> {
    match c {
        InternalCommand::Man { out } => {
            std::fs::create_dir_all(out).with_context(|| format!("{}", out.display()))?;
            man_pages(&cmd, "chio", out)?;
            Ok(0)
        }
        InternalCommand::Request { id, cwd, args } => {
            let line = match request_for(id, *cwd, args) {
                Ok(r) => r,
                Err(e) => {
                    eprint!("{e}");
                    return Ok(2);
                }
            };
            println!("{}", serde_json::to_string(&line)?);
            Ok(0)
        }
        InternalCommand::Parse { args } => {
            let argv = std::iter::once(OsString::from("chio")).chain(args.iter().cloned());
            match cmd.try_get_matches_from(argv) {
                Ok(_) => Ok(0),
                Err(e) => {
                    eprint!("{e}");
                    Ok(2)
                }
            }
        }
    }
}

/// `chio.1`, `chio-cage.1`, `chio-cage-run.1`, … for every visible subcommand.
fn man_pages(cmd: &Command, name: &str, out: &Path) -> Result<()> {
    let page = cmd.clone().name(name.to_string());
    let mut bytes = Vec::new();
    clap_mangen::Man::new(page).render(&mut bytes)?;
    std::fs::write(out.join(format!("{name}.1")), bytes)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, &format!("{name}-{}", sub.get_name()), out)?;
    }
    Ok(())
}

/// The request `chio cage run ARGS` or `chio repository ARGS` (`args` starting with `cage run`
/// or `repository`) sends with `--supervisor`, as `id`; a usage error as clap words it.
pub fn request_for(id: &str, cwd: bool, args: &[OsString]) -> std::result::Result<Request, String> {
    let fds = |stdin| Fds { cwd, stdin };
    let first: Vec<&str> = args.iter().take(2).filter_map(|a| a.to_str()).collect();
    match first.as_slice() {
        ["cage", "run", ..] => {
            use clap::FromArgMatches;
            let runs = std::iter::once(OsString::from("run")).chain(args[2..].iter().cloned());
            let matches = crate::cage_cmd::parser().try_get_matches_from(runs).map_err(|e| e.to_string())?;
            let a = RunArgs::from_arg_matches(&matches).map_err(|e| e.to_string())?;
            let launch = crate::cage_cmd::request_from(&a).map_err(|e| format!("{e:#}\n"))?;
            Ok(Request::Launch {
                protocol: Protocol::V2,
                id: id.into(),
                launch: Box::new(launch),
                env: Vec::new(),
                fds: fds(a.interactive),
            })
        }
        ["repository", ..] => {
            let command = crate::repository_cmd::parse_args(&args[1..]).map_err(|e| e.to_string())?.operation();
            let stdin = matches!(command, Operation::Serve { .. });
            Ok(Request::Repository {
                protocol: Protocol::V2,
                id: id.into(),
                command: Box::new(command),
                env: Vec::new(),
                fds: fds(stdin),
            })
        }
        _ => Err("give `cage run …` or `repository …`\n".into()),
    }
}
