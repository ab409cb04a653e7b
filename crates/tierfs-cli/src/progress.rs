//! Progress of a long operator command (`tierfs warm`): a progress bar (bytes, files, rate,
//! ETA) when stderr is a terminal, else one plain line every few seconds, for logs and
//! scripts (a bar redrawn with carriage returns is noise in a log file).

use indicatif::{HumanBytes, HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often the plain mode prints a line.
const PLAIN_EVERY: Duration = Duration::from_secs(1);
/// No progress for this long is a stall: said as such, with no rate or ETA (a store that
/// stopped answering showed "0 B/s ETA 0s", as if done).
const STALLED: Duration = Duration::from_secs(3);

const TEMPLATE: &str =
    "{spinner} {elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg} {binary_bytes_per_sec} ETA {eta}";
const TEMPLATE_STALLED: &str =
    "{spinner} {elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg}";

pub struct Progress {
    what: &'static str,
    bar: Option<ProgressBar>,
    start: Instant,
    last_line: Instant,
    files: u64,
    total_files: u64,
    bytes: u64,
    total_bytes: u64,
    /// When `files` or `bytes` last moved, and whether the bar shows the stalled style.
    moved: Instant,
    shows_stalled: bool,
}

impl Progress {
    /// `what` names the command in plain lines ("warm").
    pub fn new(what: &'static str, total_files: u64, total_bytes: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(
                Some(total_bytes),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            b.set_style(
                ProgressStyle::with_template(TEMPLATE)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b.set_message(format!("0/{total_files} files"));
            // Redrawn while a large file is being warmed (progress moves a file at a time).
            b.enable_steady_tick(Duration::from_millis(250));
            b
        });
        Progress {
            what,
            bar,
            start: Instant::now(),
            last_line: Instant::now(),
            files: 0,
            total_files,
            bytes: 0,
            total_bytes,
            moved: Instant::now(),
            shows_stalled: false,
        }
    }

    /// One more file done, of `bytes` bytes.
    pub fn file_done(&mut self, bytes: u64) {
        self.set_done(self.files + 1, self.bytes + bytes);
    }

    /// `files` files and `bytes` bytes done so far (for work measured from outside).
    pub fn set_done(&mut self, files: u64, bytes: u64) {
        if (files, bytes) != (self.files, self.bytes) {
            self.moved = Instant::now();
        }
        self.files = files;
        self.bytes = bytes;
        let stalled = self.stalled();
        match &self.bar {
            Some(b) => {
                if stalled.is_some() != self.shows_stalled {
                    self.shows_stalled = stalled.is_some();
                    let t = if self.shows_stalled {
                        TEMPLATE_STALLED
                    } else {
                        TEMPLATE
                    };
                    b.set_style(
                        ProgressStyle::with_template(t)
                            .expect("valid template")
                            .progress_chars("=> "),
                    );
                }
                let mut msg = format!("{}/{} files", self.files, self.total_files);
                if let Some(s) = stalled {
                    msg += &format!(", no progress for {s}");
                }
                b.set_message(msg);
            }
            None if self.last_line.elapsed() >= PLAIN_EVERY => {
                self.last_line = Instant::now();
                eprintln!("{}", self.line());
            }
            None => {}
        }
    }

    /// A warning that must not garble the bar.
    pub fn warn(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{msg}")),
            None => eprintln!("{msg}"),
        }
    }

    /// "12 seconds" once nothing moved for [`STALLED`] or more.
    fn stalled(&self) -> Option<String> {
        let still = self.moved.elapsed();
        (still >= STALLED && self.bytes < self.total_bytes)
            .then(|| HumanDuration(Duration::from_secs(still.as_secs())).to_string())
    }

    /// "tierfs warm: 1234/50000 files, 12.3 MiB/195.3 MiB (6%), 4.1 MiB/s, ETA 45 seconds"
    fn line(&self) -> String {
        let secs = self.start.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            self.bytes as f64 / secs
        } else {
            0.0
        };
        let eta = if rate > 0.0 {
            let left = self.total_bytes.saturating_sub(self.bytes) as f64 / rate;
            HumanDuration(Duration::from_secs_f64(left)).to_string()
        } else {
            "unknown".into()
        };
        let pct = (self.bytes * 100)
            .checked_div(self.total_bytes)
            .unwrap_or(self.files * 100 / self.total_files.max(1));
        if let Some(s) = self.stalled() {
            return format!(
                "tierfs {}: {}/{} files, {}/{} ({pct}%), no progress for {s}",
                self.what,
                self.files,
                self.total_files,
                HumanBytes(self.bytes),
                HumanBytes(self.total_bytes),
            );
        }
        format!(
            "tierfs {}: {}/{} files, {}/{} ({pct}%), {}/s, ETA {eta}",
            self.what,
            self.files,
            self.total_files,
            HumanBytes(self.bytes),
            HumanBytes(self.total_bytes),
            HumanBytes(rate as u64),
        )
    }

    /// Clears the bar (the caller prints the summary).
    pub fn finish(self) -> Duration {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        self.start.elapsed()
    }
}
