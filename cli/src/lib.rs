//! The `chio` commands, built as two executables from this library:
//!
//! - `chio-full` ([`full`]) holds every command.
//! - `chio` ([`launch`]) is what users and agents call: it runs `chio cage run` itself, one-shot or
//!   as a daemon client, and hands every other command line to `chio-full` beside it (an `exec`,
//!   same process, same arguments). A launch is a process start, and a static-pie process starts
//!   in proportion to its image: relocations written and pages faulted before `main`. The launch
//!   path links none of the daemon, the gateway, the OCI runtime or the report (6 MB instead of
//!   16, a third of the relocations), which takes about 0.3 ms off every launch and every client.

mod cage_cmd;
mod daemon;
mod doc_cmd;
mod image_cmd;
mod keys_cmd;
mod meta_cmd;
mod oci_cmd;
mod progress;
mod receipt_cmd;
mod repository_cmd;
mod security_cmd;
mod session_cmd;
mod units;

use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// chio: a Linux-native sandbox supervisor with verified launches.
#[derive(Debug, Parser)]
#[command(
    name = "chio",
    version,
    about = "chio: runs commands in cages it builds from kernel primitives, observes each exec, and signs what happened",
    after_help = "Examples:\n  chio cage run -- /bin/sh -c id\n  chio image import app.tar && chio cage run --image app -- python3 -m unittest\n  chio keys generate --out /etc/chio/kernel-key\n  chio receipt verify-chain --receipt-db /var/lib/chio/receipts.db --trusted-key /etc/chio/kernel-key/public.key"
)]
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
    /// Images imported from docker save archives and OCI layouts.
    Image {
        #[command(subcommand)]
        command: image_cmd::ImageCommand,
    },
    /// Publisher-signed tool manifests.
    Manifest {
        #[command(subcommand)]
        command: doc_cmd::ManifestCommand,
    },
    /// Operator-signed cage launch policies and admission.
    Policy {
        #[command(subcommand)]
        command: doc_cmd::PolicyCommand,
    },
    /// Signed receipts: offline verification, listing, chain verification.
    Receipt {
        #[command(subcommand)]
        command: receipt_cmd::ReceiptCommand,
    },
    /// The repository execution leg: a workspace from one commit, each command in a cage,
    /// signed transitions, export and verify-export.
    Repository {
        /// Run the operation in the supervisor daemon listening on SOCKET (as $CHIO_SUPERVISOR);
        /// needs the admin role there.
        #[arg(long, value_name = "SOCKET", env = "CHIO_SUPERVISOR", global = true)]
        supervisor: Option<std::path::PathBuf>,
        #[command(subcommand)]
        command: repository_cmd::RepositoryCommand,
    },
    /// Governed sessions: an agent on the repository leg, its worker caged, the model behind a
    /// gateway that alone holds the credential.
    Session {
        #[command(subcommand)]
        command: session_cmd::SessionCommand,
    },
    /// The supervisor daemon: the only root process; unprivileged clients launch through it.
    Supervisor {
        #[command(subcommand)]
        command: daemon::SupervisorCommand,
    },
    /// Host checks for operators: `preflight` (can this host enforce this launch?).
    Security {
        #[command(subcommand)]
        command: security_cmd::SecurityCommand,
    },
    /// The OCI runtime (runc's command line) for containerd, podman and CRI; also run as
    /// `chio-runc`.
    Oci(oci_cmd::OciArgs),
    /// Ed25519 keys for signing and pinning.
    Keys {
        #[command(subcommand)]
        command: keys_cmd::KeysCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(after_help = "Example:\n  chio completions bash > /usr/share/bash-completion/completions/chio")]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Packaging helpers: man pages, a parse-only check of a command line.
    #[command(hide = true)]
    Internal {
        #[command(subcommand)]
        command: meta_cmd::InternalCommand,
    },
}

const RUN_ABOUT: &str = "Run a command in a cage and report how it was confined and how it ended";
const RUN_EXAMPLE: &str = "Examples:\n  chio cage run --json -- /bin/sh -c 'id'\n  chio cage run --workspace ./repo --net loopback --timeout 60s -- python3 -m unittest\n  chio cage run --image app:1";

#[derive(Debug, Subcommand)]
enum CageCommand {
    #[command(about = RUN_ABOUT, after_help = RUN_EXAMPLE)]
    Run(Box<cage_cmd::RunArgs>),
}

/// The command line (`chio cage run` through its own parser, [`parse_run`]).
fn parse() -> Cli {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    // Called as `chio-runc` (a link engines name as their runtime): the runc command line.
    let as_runc = args.first().and_then(|a| std::path::Path::new(a).file_name()).is_some_and(|n| n == "chio-runc");
    if as_runc {
        args.splice(0..1, ["chio".into(), "oci".into()]);
    }
    if args.get(1).is_some_and(|a| a == "oci") {
        if args.len() == 3 && (args[2] == "--version" || args[2] == "-v") {
            print!("{}", oci_cmd::VERSION);
            std::process::exit(0);
        }
        return Cli::parse_from(args);
    }
    if is_cage_run(&args) {
        let run = parse_run(&args);
        return Cli { command: Command::Cage { command: CageCommand::Run(Box::new(run)) } };
    }
    Cli::parse()
}

/// Refuse to run a production build with a test switch set (exit 2).
fn refuse_test_switches() {
    if let Some(name) = chio_supervisor::test_switch_refused() {
        eprintln!(
            "chio: {name} is set, but this chio is a production build: test switches (CHIO_TEST_*) act only in the \
             test suites' build, and this one refuses to run with any of them set; unset {name}"
        );
        std::process::exit(2);
    }
}

/// `chio cage run`'s flags, from `args` (the whole command line), through the parser built for
/// them alone: building the whole command tree first cost ~0.5 ms of a ~7 ms launch (clap's code
/// paged in for every subcommand). Same flags, messages and exit status either way.
fn parse_run(args: &[OsString]) -> cage_cmd::RunArgs {
    let cmd = cage_cmd::parser().about(RUN_ABOUT).after_help(RUN_EXAMPLE);
    let matches = cmd.get_matches_from(&args[2..]);
    cage_cmd::RunArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Is this command line `chio cage run …`?
fn is_cage_run(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|a| a == "cage") && args.get(2).is_some_and(|a| a == "run")
}

/// The process exit for a command's result: its status, or its error on stderr and `on_error`.
fn exit_with(code: anyhow::Result<i32>, on_error: i32) -> ! {
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("chio: {e:#}");
            std::process::exit(on_error);
        }
    }
}

/// The name of the executable holding every command, installed beside `chio`.
pub const FULL: &str = "chio-full";

/// The `chio` executable: `chio cage run` here; any other command line (and `chio-runc`, a link
/// an engine may point at `chio`) becomes `chio-full` in this same process.
pub fn launch() -> ! {
    refuse_test_switches();
    let args: Vec<OsString> = std::env::args_os().collect();
    if is_cage_run(&args) {
        let run = parse_run(&args);
        exit_with(cage_cmd::run(&run), 125);
    }
    hand_over(args)
}

/// Replace this process with `chio-full` beside this executable, with the same arguments
/// (`argv[0]` too: `chio-runc` keeps its name) and environment. The directory is the one
/// `/proc/self/exe` names, so a symlink to `chio` finds it too; it is never looked up in `PATH`.
fn hand_over(args: Vec<OsString>) -> ! {
    use std::os::unix::process::CommandExt;
    let full = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name(FULL),
        Err(e) => {
            eprintln!("chio: cannot find {FULL} (it runs every command but `cage run`): /proc/self/exe: {e}");
            std::process::exit(1);
        }
    };
    let mut cmd = std::process::Command::new(&full);
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    let e = cmd.args(args.iter().skip(1)).exec();
    eprintln!(
        "chio: cannot run {} ({e}): every command but `cage run` is in {FULL}, which is installed beside chio",
        full.display()
    );
    std::process::exit(1);
}

/// The `chio-full` executable: every command.
pub fn full() -> ! {
    refuse_test_switches();
    let cli = parse();
    // A command that cannot run exits 125 for `cage run` (its cage-failure status) and 1 for
    // everything else; usage errors exit 2 (clap).
    let (code, on_error) = match &cli.command {
        Command::Cage { command: CageCommand::Run(args) } => (cage_cmd::run(args), 125),
        Command::Keys { command } => (keys_cmd::run(command), 1),
        Command::Oci(args) => (oci_cmd::run(args), 1),
        Command::Receipt { command } => (receipt_cmd::run(command), 1),
        Command::Manifest { command } => (doc_cmd::manifest(command), 1),
        Command::Image { command } => (image_cmd::run(command), 1),
        Command::Policy { command } => (doc_cmd::policy(command), 1),
        Command::Repository { supervisor: Some(socket), command } => {
            (daemon::client::repository(socket, command.operation()), 1)
        }
        Command::Repository { command, .. } => (repository_cmd::run(command), 1),
        Command::Session { command } => (session_cmd::run(command), 1),
        Command::Security { command } => (security_cmd::run(command), 1),
        Command::Supervisor { command } => (daemon::run(command), 1),
        Command::Completions { shell } => (meta_cmd::completions(&mut Cli::command(), *shell), 1),
        Command::Internal { command } => (meta_cmd::internal(Cli::command(), command), 1),
    };
    exit_with(code, on_error)
}
