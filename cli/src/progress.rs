//! How `chio image import` shows its progress: a bar redrawn in place on a terminal (at most
//! ten times a second), one plain line per step otherwise (logs, CI, pipes).

use std::io::Write;
use std::time::{Duration, Instant};

use chio_supervisor::image::store::Progress;

const BAR_WIDTH: usize = 30;
const REDRAW: Duration = Duration::from_millis(100);

/// Renders import progress on stderr.
pub struct ImportProgress {
    tty: bool,
    total: u64,
    done: u64,
    layers: usize,
    finished_layers: usize,
    last_draw: Option<Instant>,
    bar_shown: bool,
}

impl ImportProgress {
    /// `tty`: stderr is a terminal.
    pub fn new(tty: bool) -> Self {
        ImportProgress { tty, total: 0, done: 0, layers: 0, finished_layers: 0, last_draw: None, bar_shown: false }
    }

    /// Take one event.
    pub fn event(&mut self, p: Progress<'_>) {
        match p {
            Progress::Start { image_id, layers, total_bytes } => {
                (self.total, self.layers) = (total_bytes, layers);
                self.line(&format!("image {image_id} ({layers} layers, {})", mib(total_bytes)));
            }
            Progress::Bytes { done } => {
                self.done = done;
                self.draw(false);
            }
            Progress::Layer { index, count, diff_id } => {
                self.finished_layers = index;
                if self.tty {
                    self.draw(true);
                } else {
                    self.line(&format!("layer {index}/{count} {diff_id}"));
                }
            }
            Progress::Done { image_id, already_present } => {
                let what = if already_present { "verified (already extracted)" } else { "imported" };
                self.line(&format!("{what} {image_id}"));
            }
        }
    }

    /// Take the bar off the terminal (before an error message, say).
    pub fn clear(&mut self) {
        if self.bar_shown {
            eprint!("\r\x1b[K");
            self.bar_shown = false;
        }
    }

    fn line(&mut self, text: &str) {
        self.clear();
        eprintln!("chio: {text}");
    }

    fn draw(&mut self, force: bool) {
        if !self.tty || (!force && self.last_draw.is_some_and(|t| t.elapsed() < REDRAW)) {
            return;
        }
        self.last_draw = Some(Instant::now());
        let layer = (self.finished_layers + 1).min(self.layers);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[Kchio: {}  layer {layer}/{}", bar(self.done, self.total), self.layers);
        let _ = err.flush();
        self.bar_shown = true;
    }
}

/// `[#####-----]  50%  1.0/2.0 MiB`.
fn bar(done: u64, total: u64) -> String {
    let frac = if total == 0 { 1.0 } else { (done as f64 / total as f64).min(1.0) };
    let filled = (frac * BAR_WIDTH as f64) as usize;
    format!(
        "[{}{}] {:3.0}%  {}/{}",
        "#".repeat(filled),
        "-".repeat(BAR_WIDTH - filled),
        frac * 100.0,
        mib(done).trim_end_matches(" MiB"),
        mib(total)
    )
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_bytes_read() {
        assert_eq!(bar(0, 4 << 20), format!("[{}]   0%  0.0/4.0 MiB", "-".repeat(30)));
        assert_eq!(bar(2 << 20, 4 << 20), format!("[{}{}]  50%  2.0/4.0 MiB", "#".repeat(15), "-".repeat(15)));
        assert_eq!(bar(5 << 20, 4 << 20), format!("[{}] 100%  5.0/4.0 MiB", "#".repeat(30)));
        assert_eq!(bar(0, 0), format!("[{}] 100%  0.0/0.0 MiB", "#".repeat(30)));
    }
}
