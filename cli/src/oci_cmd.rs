//! `chio oci` (and `chio-runc`): the runc command line, for containerd, podman and CRI.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use chio_supervisor::oci::{self, Global};
use clap::{Args, Subcommand};

/// The runtime's global options, as engines pass them to runc.
#[derive(Debug, Args)]
pub struct OciArgs {
    /// Where container state lives.
    #[arg(long, global = true, value_name = "DIR", default_value = oci::state::DEFAULT_ROOT)]
    root: PathBuf,
    /// Append errors to this file as well as stderr (the engine reads it when a call fails).
    #[arg(long, global = true, value_name = "FILE")]
    log: Option<PathBuf>,
    /// The log's format: text or json.
    #[arg(long = "log-format", global = true, value_name = "FORMAT", default_value = "text")]
    log_format: String,
    /// Use systemd for cgroups: refused, chio manages the container's cgroup itself.
    #[arg(long = "systemd-cgroup", global = true)]
    systemd_cgroup: bool,
    /// The node's configuration: receipts, bind sources, ceilings (default /etc/chio/oci.json).
    /// Engines that do not pass their environment on take it as a runtime flag (podman
    /// --runtime-flag node-config=FILE).
    #[arg(long = "node-config", global = true, value_name = "FILE", env = "CHIO_OCI_CONFIG")]
    node_config: Option<PathBuf>,
    /// Accepted for compatibility; chio logs nothing more with it.
    #[arg(long, global = true)]
    debug: bool,
    #[command(subcommand)]
    command: OciCommand,
}

#[derive(Debug, Subcommand)]
enum OciCommand {
    /// Build a container from a bundle and park it before its process runs.
    Create {
        /// The bundle directory (holding config.json).
        #[arg(long, short = 'b', default_value = ".")]
        bundle: PathBuf,
        /// Write the container's pid here before returning.
        #[arg(long = "pid-file", value_name = "FILE")]
        pid_file: Option<PathBuf>,
        /// Where to send the container's terminal (its pty's master), when it has one.
        #[arg(long = "console-socket", value_name = "SOCKET")]
        console_socket: Option<PathBuf>,
        /// Accepted for compatibility (chio always pivots).
        #[arg(long = "no-pivot")]
        no_pivot: bool,
        /// Accepted for compatibility (chio makes no session keyring).
        #[arg(long = "no-new-keyring")]
        no_new_keyring: bool,
        /// Extra descriptors to pass: refused unless 0.
        #[arg(long = "preserve-fds", default_value_t = 0)]
        preserve_fds: u32,
        /// The container's id.
        id: String,
    },
    /// Release a created container: its exec is observed and recorded.
    Start { id: String },
    /// Print a container's state (JSON).
    State { id: String },
    /// Send a signal (a number or a name, SIGTERM by default).
    Kill {
        /// Signal every process in the container.
        #[arg(long, short = 'a')]
        all: bool,
        id: String,
        #[arg(default_value = "SIGTERM")]
        signal: String,
    },
    /// Remove a container; --force kills a running one first.
    Delete {
        #[arg(long, short = 'f')]
        force: bool,
        id: String,
    },
    /// List a container's processes.
    Ps {
        /// table or json.
        #[arg(long, short = 'f', default_value = "table")]
        format: String,
        id: String,
        /// ps options (only with the table format; ignored).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        ps_args: Vec<String>,
    },
    /// Freeze a running container.
    Pause { id: String },
    /// Thaw a paused container.
    Resume { id: String },
    /// Run a further process in a running container, confined as its first and observed at
    /// its exec.
    Exec {
        /// The process as the spec's JSON (args, env, cwd, user, terminal, rlimits).
        #[arg(long, short = 'p', value_name = "FILE")]
        process: Option<PathBuf>,
        /// Return once the exec is observed (the engine's subreaper waits for the process).
        #[arg(long, short = 'd')]
        detach: bool,
        /// Write the process's pid here.
        #[arg(long = "pid-file", value_name = "FILE")]
        pid_file: Option<PathBuf>,
        /// Where to send the process's terminal (its pty's master).
        #[arg(long = "console-socket", value_name = "SOCKET")]
        console_socket: Option<PathBuf>,
        /// Give the process a terminal.
        #[arg(long, short = 't')]
        tty: bool,
        /// Working directory inside the container.
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// A variable to set (K=V), repeatable.
        #[arg(long, short = 'e', value_name = "K=V")]
        env: Vec<String>,
        /// UID[:GID] to run as.
        #[arg(long, short = 'u', value_name = "UID[:GID]")]
        user: Option<String>,
        /// Accepted: chio always sets no_new_privs.
        #[arg(long = "no-new-privs")]
        no_new_privs: bool,
        /// A capability to add: refused (chio grants a container's processes none).
        #[arg(long, short = 'c', value_name = "CAP")]
        cap: Vec<String>,
        /// An AppArmor profile or SELinux label: refused (landlock and seccomp confine it).
        #[arg(long, value_name = "PROFILE")]
        apparmor: Option<String>,
        #[arg(long = "process-label", value_name = "LABEL")]
        process_label: Option<String>,
        /// Extra descriptors to pass: refused unless 0.
        #[arg(long = "preserve-fds", default_value_t = 0)]
        preserve_fds: u32,
        /// The container's id.
        id: String,
        /// The command and its arguments (without --process).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// What this runtime supports (JSON).
    Features,
}

/// Run one runtime call; an error is also appended to `--log`.
pub fn run(a: &OciArgs) -> Result<i32> {
    match call(a) {
        Ok(code) => Ok(code),
        Err(e) => {
            log_error(a, &format!("{e:#}"));
            Err(e)
        }
    }
}

fn call(a: &OciArgs) -> Result<i32> {
    if a.systemd_cgroup {
        bail!(
            "--systemd-cgroup is not supported: chio makes and removes each container's cgroup itself (configure the \
             engine with the cgroupfs manager, e.g. podman --cgroup-manager cgroupfs, or SystemdCgroup = false)"
        );
    }
    let g = Global { root: a.root.clone(), node_config: a.node_config.clone() };
    let said = |r: Result<(), String>| r.map(|()| 0).map_err(anyhow::Error::msg);
    match &a.command {
        OciCommand::Create { bundle, pid_file, console_socket, preserve_fds, id, .. } => {
            if *preserve_fds > 0 {
                bail!("--preserve-fds {preserve_fds}: chio passes the container only its stdin, stdout and stderr");
            }
            said(oci::create(&g, id, bundle, pid_file.as_deref(), console_socket.as_deref()))
        }
        OciCommand::Start { id } => said(oci::start(&g, id)),
        OciCommand::State { id } => {
            let s = oci::state_json(&g, id).map_err(anyhow::Error::msg)?;
            println!("{}", serde_json::to_string_pretty(&s)?);
            Ok(0)
        }
        OciCommand::Kill { all, id, signal } => {
            let sig = oci::parse_signal(signal).map_err(anyhow::Error::msg)?;
            said(oci::kill_container(&g, id, sig, *all))
        }
        OciCommand::Delete { force, id } => said(oci::delete(&g, id, *force)),
        OciCommand::Ps { format, id, .. } => {
            let pids = oci::ps(&g, id).map_err(anyhow::Error::msg)?;
            match format.as_str() {
                "json" => println!("{}", serde_json::to_string(&pids)?),
                "table" => {
                    println!("PID");
                    for p in pids {
                        println!("{p}");
                    }
                }
                other => bail!("unknown ps format {other:?}: use table or json"),
            }
            Ok(0)
        }
        OciCommand::Pause { id } => said(oci::pause(&g, id, true)),
        OciCommand::Resume { id } => said(oci::pause(&g, id, false)),
        OciCommand::Exec {
            process,
            detach,
            pid_file,
            console_socket,
            tty,
            cwd,
            env,
            user,
            no_new_privs: _,
            cap,
            apparmor,
            process_label,
            preserve_fds,
            id,
            args,
        } => {
            if !cap.is_empty() {
                bail!("--cap {}: chio grants a container's processes no capability", cap.join(","));
            }
            if apparmor.as_deref().is_some_and(|p| !p.is_empty())
                || process_label.as_deref().is_some_and(|p| !p.is_empty())
            {
                bail!("--apparmor and --process-label: chio applies neither (its landlock and seccomp confine the process)");
            }
            if *preserve_fds > 0 {
                bail!("--preserve-fds {preserve_fds}: chio passes the process only its stdin, stdout and stderr");
            }
            let a = oci::exec::ExecArgs {
                id,
                process: process.as_deref(),
                args,
                cwd: cwd.as_deref(),
                env,
                user: user.as_deref(),
                tty: *tty,
                console_socket: console_socket.as_deref(),
                detach: *detach,
                pid_file: pid_file.as_deref(),
            };
            oci::exec::exec(&g, &a).map_err(anyhow::Error::msg)
        }
        OciCommand::Features => {
            println!("{}", serde_json::to_string_pretty(&oci::features())?);
            Ok(0)
        }
    }
}

/// Append `msg` to the `--log` file in its format (runc's JSON lines: level, msg, time).
fn log_error(a: &OciArgs, msg: &str) {
    let Some(path) = &a.log else { return };
    let line = match a.log_format.as_str() {
        "json" => {
            serde_json::json!({"level": "error", "msg": msg, "time": chio_cage::record::now_rfc3339()}).to_string()
        }
        _ => format!("time=\"{}\" level=error msg={msg:?}", chio_cage::record::now_rfc3339()),
    };
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// `runc --version`'s shape: engines print it.
pub const VERSION: &str = concat!("chio-runc version ", env!("CARGO_PKG_VERSION"), "\nspec: 1.0.2\n");
