//! The daemon's log: events with fields (`tracing`). Under systemd — its stderr is the journal's
//! stream (`JOURNAL_STREAM`) — each event goes to the journal natively (`tracing-journald`), its
//! fields as journal fields: `CHIO_REQUEST_ID`, `CHIO_PEER_UID`, `CHIO_OUTCOME`, `CHIO_REASON`,
//! `CHIO_LAUNCH_ID` and the like, so `journalctl -u chio-supervisor CHIO_OUTCOME=refused` finds
//! the refusals. In the foreground, text or JSON lines on stderr (`--log-format`).

use std::os::fd::AsFd;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use super::{Context, Result};

/// How the daemon logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// The journal when stderr is its stream, text otherwise.
    Auto,
    /// Text lines on stderr.
    Text,
    /// One JSON object a line on stderr, the fields at its top level.
    Json,
    /// The journal's native protocol (refused where there is no journal).
    Journal,
}

impl LogFormat {
    /// Every format's name, as `--log-format` takes it.
    pub const NAMES: [&str; 4] = ["auto", "text", "json", "journal"];

    /// The format named `name` (one of [`LogFormat::NAMES`]).
    pub fn parse(name: &str) -> Option<LogFormat> {
        match name {
            "auto" => Some(LogFormat::Auto),
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            "journal" => Some(LogFormat::Journal),
            _ => None,
        }
    }
}

/// The journal field prefix of every field chio's events carry (`CHIO_OUTCOME`, …).
const FIELD_PREFIX: &str = "CHIO";

/// Start logging as `format`; returns the format chosen (for `Auto`, what it found). Called
/// once, before the launcher is forked: every process of the daemon logs the same way.
pub fn init(format: LogFormat) -> Result<LogFormat> {
    let format = match format {
        LogFormat::Auto if stderr_is_the_journal() => LogFormat::Journal,
        LogFormat::Auto => LogFormat::Text,
        f => f,
    };
    let registry = tracing_subscriber::registry();
    let started = match format {
        LogFormat::Journal => {
            let journal = tracing_journald::layer()
                .context("--log-format journal: the journal's socket (/run/systemd/journal/socket)")?
                .with_field_prefix(Some(FIELD_PREFIX.into()));
            registry.with(journal).try_init()
        }
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .with_writer(std::io::stderr);
            registry.with(json).try_init()
        }
        LogFormat::Text | LogFormat::Auto => {
            let text =
                tracing_subscriber::fmt::layer().with_ansi(false).with_target(false).with_writer(std::io::stderr);
            registry.with(text).try_init()
        }
    };
    started.map_err(|e| super::DaemonError::msg(format!("starting the log: {e}")))?;
    Ok(format)
}

/// Whether stderr is the stream systemd connected to the journal: `JOURNAL_STREAM` names its
/// device and inode (systemd.exec(5)); a variable inherited by a process whose stderr went
/// elsewhere does not match.
fn stderr_is_the_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(named) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = named.to_str().and_then(|s| s.split_once(':')) else { return false };
    let Ok(stderr) = std::io::stderr().as_fd().try_clone_to_owned().map(std::fs::File::from) else { return false };
    stderr.metadata().is_ok_and(|m| dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_format_is_named() {
        for name in LogFormat::NAMES {
            assert!(LogFormat::parse(name).is_some(), "{name}");
        }
        assert_eq!(LogFormat::parse("syslog"), None);
    }
}
