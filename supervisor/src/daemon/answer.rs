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
//! its line, and then, in one write on the pipe, the number of bytes the client's socket took,
//! a newline and the answer (a JSON object). An empty pipe without that word means nothing
//! reached the client; one with it, and a pipe that ends before the answer, leave the
//! connection in an unknown state, and the daemon closes it.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::socket::MsgFlags;

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

/// What the daemon read on a launch's answer pipe.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing reached the client (the launch child ended first).
    NotSent,
    /// The launch child began writing to the client and ended before saying what it sent.
    Unknown,
    /// The client's socket took the first `sent` bytes of the line (newline included) for
    /// `answer`.
    Sent {
        /// Bytes of the answer line, newline included, the client's socket took.
        sent: usize,
        /// The answer.
        answer: String,
    },
}

/// Read the pipe's contents, `sending` whether the launch child said [`SENDING`].
pub fn parse(bytes: &[u8], sending: bool) -> Delivery {
    let written = bytes.iter().position(|&b| b == b'\n').and_then(|end| {
        let sent: usize = std::str::from_utf8(&bytes[..end]).ok()?.parse().ok()?;
        let answer = String::from_utf8(bytes[end + 1..].to_vec()).ok().filter(|a| !a.is_empty())?;
        Some((sent, answer))
    });
    match (written, sending) {
        (Some((sent, answer)), true) => Delivery::Sent { sent, answer },
        (None, true) => Delivery::Unknown,
        // Nothing went to the client: the daemon writes all of an answer there is.
        (Some((0, answer)), false) => Delivery::Sent { sent: 0, answer },
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
        assert_eq!(parse(b"", false), Delivery::NotSent);
        assert_eq!(parse(b"12\n{}", false), Delivery::NotSent, "sent without having said so");
        assert_eq!(parse(b"0\n{}", false), Delivery::Sent { sent: 0, answer: "{}".into() });
        assert_eq!(parse(b"", true), Delivery::Unknown);
        assert_eq!(parse(b"12", true), Delivery::Unknown);
        assert_eq!(parse(b"12\n", true), Delivery::Unknown);
        assert_eq!(parse(b"x\n{}", true), Delivery::Unknown);
        assert_eq!(parse(b"12\n{\"a\":1}", true), Delivery::Sent { sent: 12, answer: "{\"a\":1}".into() });
        assert_eq!(parse(b"0\n{}", true), Delivery::Sent { sent: 0, answer: "{}".into() });
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
