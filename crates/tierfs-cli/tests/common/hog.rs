//! A memory hog for the pressure tests: a second process (this test binary, started again
//! with [`HOG_ENV`] set) that maps and touches anonymous memory in 128 MiB steps up to a
//! target, holds it until its stdin closes, then exits.
//!
//! It is polite, so that a test can never OOM the machine (other jobs share it): it takes a
//! step only while MemAvailable stays above a safety line after it, waits otherwise (for
//! tierfs to give memory back), gives up after a deadline, and while holding hands chunks
//! back when MemAvailable falls below the line. Its oom_score_adj is 1000: if the kernel
//! must kill something after all, it is the hog.
//!
//! While holding it also keeps the pressure it was asked for: when other processes free
//! memory and MemAvailable rises above `leave` by a step, it takes another step (up to 4 GiB
//! beyond its target), so that what is left for tierfs does not depend on what the rest of
//! the machine happens to do meanwhile.

use super::memory::meminfo;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const HOG_ENV: &str = "TIERFS_TEST_HOG";
const STEP: u64 = 128 << 20;
/// The hog gives up growing after this long without a step (waiting for memory).
const DEADLINE: Duration = Duration::from_secs(20);

/// If this process was started as a hog, runs it and exits; otherwise returns at once. Call
/// first thing in the test that starts hogs (the hog runs that test, `--exact`).
pub fn run_if_child() {
    let Ok(spec) = std::env::var(HOG_ENV) else {
        return;
    };
    let mut it = spec.split(',').map(|v| v.parse::<u64>().expect("hog spec"));
    let (target, safety, leave) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    hog_main(target, safety, leave);
    std::process::exit(0);
}

struct Chunk(*mut libc::c_void, usize);

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Maps and touches `n` bytes; None if the kernel refused.
fn take(n: usize) -> Option<Chunk> {
    // SAFETY: a fresh private anonymous mapping, touched only within its length.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    for off in (0..n).step_by(4096) {
        // SAFETY: off < n, inside the mapping.
        unsafe { std::ptr::write_volatile((p as *mut u8).add(off), 1) };
    }
    Some(Chunk(p, n))
}

fn hog_main(target: u64, safety: u64, leave: u64) {
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    let start = Instant::now();
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut held = 0u64;
    let mut waited = Duration::ZERO;
    let mut last_step = start;
    while held < target {
        if meminfo("MemAvailable") < safety + STEP {
            if last_step.elapsed() > DEADLINE {
                say(&format!("stuck {held}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
            waited += Duration::from_millis(10);
            continue;
        }
        let n = STEP.min(target - held) as usize;
        match take(n) {
            Some(c) => chunks.push(c),
            None => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        held += n as u64;
        last_step = Instant::now();
        say(&format!("held {held}"));
    }
    say(&format!("done {held} {}", waited.as_millis()));
    let closed = Arc::new(AtomicBool::new(false));
    let c = closed.clone();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        c.store(true, SeqCst);
    });
    while !closed.load(SeqCst) {
        let avail = meminfo("MemAvailable");
        if avail < safety {
            if let Some(Chunk(p, n)) = chunks.pop() {
                // SAFETY: a mapping made above, unmapped once.
                unsafe { libc::munmap(p, n) };
                held -= n as u64;
                say(&format!("released {held}"));
            }
        } else if avail > leave + 2 * STEP && held < target + (4 << 30) {
            if let Some(c) = take(STEP as usize) {
                chunks.push(c);
                held += STEP;
                say(&format!("topped {held}"));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the parent knows of its hog.
#[derive(Clone, Debug, Default)]
pub struct HogState {
    pub held: u64,
    /// When it reached its target (or gave up: `stuck`).
    pub done: Option<Instant>,
    pub stuck: bool,
    /// Time it spent waiting for memory before it was done.
    pub waited_ms: u64,
    /// Bytes it handed back while holding, to keep the host above its safety line.
    pub released: u64,
    /// Bytes it took while holding, because others freed memory.
    pub topped: u64,
}

pub struct Hog {
    child: Option<Child>,
    pub pid: i32,
    state: Arc<Mutex<HogState>>,
}

impl Hog {
    /// Starts a hog of `target` bytes that keeps MemAvailable above `safety` and, once it
    /// holds its target, near `leave`. `test` is the name of the calling test, which must
    /// call [`run_if_child`] first.
    pub fn start(test: &str, target: u64, safety: u64, leave: u64) -> Hog {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .env(HOG_ENV, format!("{target},{safety},{leave}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the hog");
        let state = Arc::new(Mutex::new(HogState::default()));
        let (st, out) = (state.clone(), child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let f: Vec<&str> = line.split_whitespace().collect();
                let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                let mut s = st.lock().unwrap();
                match f.first().copied() {
                    Some("held") => s.held = n(1),
                    Some("stuck") => {
                        s.held = n(1);
                        s.stuck = true;
                    }
                    Some("done") => {
                        s.held = n(1);
                        s.waited_ms = n(2);
                        s.done = Some(Instant::now());
                    }
                    Some("topped") => {
                        s.topped += n(1) - s.held;
                        s.held = n(1);
                    }
                    Some("released") => {
                        s.released += s.held - n(1);
                        s.held = n(1);
                    }
                    _ => {}
                }
            }
        });
        Hog {
            pid: child.id() as i32,
            child: Some(child),
            state,
        }
    }

    pub fn state(&self) -> HogState {
        self.state.lock().unwrap().clone()
    }

    /// Tells the hog to exit and waits for it; its exit status (a kill by the OOM killer
    /// shows as signal 9).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("hog running");
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
