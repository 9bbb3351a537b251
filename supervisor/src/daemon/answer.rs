//! How a launch's answer reaches its client. The launch child writes the answer line to the
//! client's connection itself — the daemon would otherwise wake to read it from the launch's
//! answer pipe and write it again, a hop on the client's path — and then tells the daemon, on
//! that pipe, what it sent and what the answer was. The daemon journals the answer and writes
//! whatever part of the line the client's socket did not take at once (a client that does not
//! read its answers fills its socket: that rest then waits for it, under the daemon's write
//! timeout, as any answer the daemon writes does).
//!
//! Before anything goes to the client, the launch child says [`SENDING`] on its gate (which the
//! daemon reads only once the pipe has ended: the word wakes no one); then it writes the client
//! its line, and then, in one write on the pipe, what it tells the daemon ([`Told`]: the number
//! of bytes the client's socket took, and figures for the daemon's metrics) as one JSON line,
//! and the answer (a JSON object). An empty pipe without that word means nothing reached the
//! client; one with it, and a pipe that ends before the answer, leave the connection in an
//! unknown state, and the daemon closes it.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::MsgFlags;
use serde::{Deserialize, Serialize};

/// The launch child's word on its gate before it writes to the client.
pub const SENDING: u8 = b'S';

/// The answer line to request `id` (without its newline): `text`, a JSON object, with `"id"` as
/// its first member (the launch child and the daemon write the same bytes).
pub fn line(id: &str, text: &str) -> String {
    let rest = text.trim_start().strip_prefix('{').unwrap_or("}").trim_start();
    let sep = if rest.starts_with('}') { "" } else { "," };
    format!("{{\"id\":{}{sep}{rest}", serde_json::Value::from(id))
}

/// Write as much of `line` to the client's connection as its socket takes now, never waiting;
/// returns how many bytes it took.
pub fn send_now(conn: &OwnedFd, line: &[u8]) -> usize {
    let mut sent = 0;
    while sent < line.len() {
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        match nix::sys::socket::send(conn.as_raw_fd(), &line[sent..], flags) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    sent
}

/// What a launch child tells the daemon on its answer pipe, before the answer.
#[derive(Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Told {
    /// Bytes of the answer line, newline included, the client's socket took.
    pub sent: usize,
    /// When its target's exec was observed (`CLOCK_MONOTONIC`, ns), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_observed_ns: Option<u64>,
    /// How long each of its writes to the receipt store took (µs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receipt_writes_us: Vec<u64>,
}

impl Told {
    /// The pipe's contents: this as one JSON line, then `answer`.
    pub fn with(&self, answer: &str) -> String {
        let head = serde_json::to_string(self).unwrap_or_else(|_| format!("{{\"sent\":{}}}", self.sent));
        format!("{head}\n{answer}")
    }
}

/// Now on `CLOCK_MONOTONIC`, in ns (the clock `std::time::Instant` reads on Linux, and one every
/// process of the daemon shares).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0))
        .unwrap_or(0)
}

/// What the daemon read on a launch's answer pipe.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing reached the client (the launch child ended first).
    NotSent,
    /// The launch child began writing to the client and ended before saying what it sent.
    Unknown,
    /// The client's socket took the first `told.sent` bytes of the line (newline included) for
    /// `answer`.
    Sent {
        /// What the launch child told, the bytes the client took among it.
        told: Told,
        /// The answer.
        answer: String,
    },
}

/// Read the pipe's contents, `sending` whether the launch child said [`SENDING`].
pub fn parse(bytes: &[u8], sending: bool) -> Delivery {
    let written = bytes.iter().position(|&b| b == b'\n').and_then(|end| {
        let told: Told = serde_json::from_slice(&bytes[..end]).ok()?;
        let answer = String::from_utf8(bytes[end + 1..].to_vec()).ok().filter(|a| !a.is_empty())?;
        Some((told, answer))
    });
    match (written, sending) {
        (Some((told, answer)), true) => Delivery::Sent { told, answer },
        (None, true) => Delivery::Unknown,
        // Nothing went to the client: the daemon writes all of an answer there is.
        (Some((told, answer)), false) if told.sent == 0 => Delivery::Sent { told, answer },
        (_, false) => Delivery::NotSent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id goes first into any answer, and the line stays one JSON object.
    #[test]
    fn the_id_goes_first_into_any_answer() {
        let parsed = |t: String| serde_json::from_str::<serde_json::Value>(&t).expect("JSON");
        let a = parsed(line("r-1", r#"{"exit_status":3,"record":{"state":"FullyEnforced"}}"#));
        assert_eq!(a, serde_json::json!({"id": "r-1", "exit_status": 3, "record": {"state": "FullyEnforced"}}));
        assert_eq!(parsed(line("r.2", " { } ")), serde_json::json!({"id": "r.2"}));
        assert!(line("x", r#"{"b":2}"#).starts_with(r#"{"id":"x","#));
    }

    /// Each way a pipe can end reads as what it means.
    #[test]
    fn a_pipe_reads_as_what_reached_the_client() {
        let sent = |sent| Told { sent, ..Told::default() };
        let told = |n: usize, a: &str| Told { sent: n, ..Told::default() }.with(a).into_bytes();
        assert_eq!(parse(b"", false), Delivery::NotSent);
        assert_eq!(parse(&told(12, "{}"), false), Delivery::NotSent, "sent without having said so");
        assert_eq!(parse(&told(0, "{}"), false), Delivery::Sent { told: sent(0), answer: "{}".into() });
        assert_eq!(parse(b"", true), Delivery::Unknown);
        assert_eq!(parse(br#"{"sent":12}"#, true), Delivery::Unknown);
        assert_eq!(parse(&told(12, ""), true), Delivery::Unknown);
        assert_eq!(parse(b"12\n{}", true), Delivery::Unknown, "a head that is not what a launch child tells");
        assert_eq!(
            parse(&told(12, r#"{"a":1}"#), true),
            Delivery::Sent { told: sent(12), answer: r#"{"a":1}"#.into() }
        );
        assert_eq!(parse(&told(0, "{}"), true), Delivery::Sent { told: sent(0), answer: "{}".into() });
        let full = Told { sent: 3, exec_observed_ns: Some(5), receipt_writes_us: vec![7, 9] };
        assert_eq!(parse(full.with("{}").as_bytes(), true), Delivery::Sent { told: full, answer: "{}".into() });
    }

    /// A socket that takes part of a line takes no more without waiting, and says how much.
    #[test]
    fn sending_now_never_waits_and_counts_what_was_taken() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let a = OwnedFd::from(a);
        let big = vec![b'x'; 8 << 20];
        let sent = send_now(&a, &big);
        assert!(sent > 0 && sent < big.len(), "took {sent} of {}", big.len());
        assert_eq!(send_now(&a, b"more"), 0, "a full socket takes nothing");
        drop(b);
        assert_eq!(send_now(&a, b"gone"), 0, "a closed peer takes nothing (and raises no SIGPIPE)");
    }
}
