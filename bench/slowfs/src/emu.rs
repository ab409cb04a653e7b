//! The slow-store model: per-request latency, seek penalty and a shared bandwidth timeline.
//!
//! Every FUSE request gets a *deadline*: the instant its reply may be sent. Replies are not slept
//! on by the FUSE worker threads; they are handed to one timer thread that sends each reply when
//! its deadline passes. So emulated latency does not occupy worker threads, and the number of
//! requests in flight is decided by the client (as with a real disk or NFS server), not by the
//! number of FUSE threads.
//!
//! Data requests (read/write) are placed on a device timeline protected by one mutex:
//!
//! ```text
//! ready    = arrival + latency                (request reaches the device / server)
//! start    = max(ready, timeline_free)        (wait for the device / link to be free)
//! busy     = [seek if not sequential] + bytes / bandwidth
//! finish   = start + busy = new timeline_free = deadline of the reply
//! ```
//!
//! Because `timeline_free` is shared by all threads, concurrent requests cannot exceed the
//! bandwidth cap and (for a one-head disk) seeks serialize. A request is *sequential* when its
//! offset equals the end of the previous data access to the same inode.
//!
//! `stream_gap`: a disk that was streaming sequentially keeps reading into its track cache for a
//! short while after the host stopped asking, so a sequential request that arrives at most
//! `stream_gap` after the device became idle continues at `timeline_free` instead of `now`. This
//! is what lets a QD1 reader (dd) get the full media rate from a real HDD despite the tiny host
//! round trip between requests. It never lets throughput exceed the bandwidth cap, since
//! transfers still sit back to back on the timeline.
//!
//! Metadata requests (everything except read/write) get `deadline = arrival + latency + meta`
//! and do not occupy the device timeline (for `hdd`: metadata is assumed to come from the host's
//! dentry/inode cache, which is what a real HDD-backed server mostly does).

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Emulation parameters, after applying profile defaults and flag overrides.
#[derive(Clone, Debug)]
pub struct Params {
    pub profile: String,
    /// Round-trip latency paid by every request (data and metadata).
    pub latency: Duration,
    /// Extra cost of a metadata request (not on the device timeline).
    pub meta: Duration,
    /// Cost of a non-sequential data access; occupies the device timeline.
    pub seek: Duration,
    /// Bandwidth cap in bytes per second; 0 = unlimited.
    pub bandwidth: u64,
    /// Separate timelines for reads and writes (a full-duplex network link) instead of one
    /// shared device timeline (a disk).
    pub duplex: bool,
    /// See module docs.
    pub stream_gap: Duration,
    /// How "sequential" is decided: per file (the offset continues the previous access to the
    /// same inode), or by one disk head (continues the previous access of the whole device, so
    /// interleaved streams seek even when each is sequential in its own file).
    pub seek_model: SeekModel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SeekModel {
    PerFile,
    Head,
}

impl Params {
    pub fn profile(name: &str) -> Option<Params> {
        let us = Duration::from_micros;
        let p = match name {
            "none" => Params {
                profile: name.into(),
                latency: Duration::ZERO,
                meta: Duration::ZERO,
                seek: Duration::ZERO,
                bandwidth: 0,
                duplex: false,
                stream_gap: Duration::ZERO,
                seek_model: SeekModel::PerFile,
            },
            // Gigabit LAN NFS server: 0.5 ms per round trip, ~110 MB/s per direction.
            "nfs-lan" => Params {
                profile: name.into(),
                latency: us(500),
                meta: Duration::ZERO,
                seek: Duration::ZERO,
                bandwidth: 110_000_000,
                duplex: true,
                stream_gap: Duration::ZERO,
                seek_model: SeekModel::PerFile,
            },
            // One 7200 rpm disk: 8 ms per random access, 150 MB/s sequential, metadata mostly
            // from the host cache (0.1 ms).
            "hdd" => Params {
                profile: name.into(),
                latency: Duration::ZERO,
                meta: us(100),
                seek: us(8000),
                bandwidth: 150_000_000,
                duplex: false,
                stream_gap: us(5000),
                seek_model: SeekModel::PerFile,
            },
            _ => return None,
        };
        Some(p)
    }

    pub fn is_zero(&self) -> bool {
        self.latency.is_zero() && self.meta.is_zero() && self.seek.is_zero() && self.bandwidth == 0
    }

    /// One line describing the effective emulation, for logs and bench reports.
    pub fn describe(&self) -> String {
        format!(
            "profile={} latency_us={} meta_us={} seek_us={} bandwidth_mbps={} \
             stream_gap_us={} seek_model={} timeline={}",
            self.profile,
            self.latency.as_micros(),
            self.meta.as_micros(),
            self.seek.as_micros(),
            if self.bandwidth == 0 {
                "unlimited".to_string()
            } else {
                format!("{}", self.bandwidth as f64 / 1e6)
            },
            self.stream_gap.as_micros(),
            match self.seek_model {
                SeekModel::PerFile => "per-file",
                SeekModel::Head => "head",
            },
            if self.duplex {
                "per-direction(read,write)"
            } else {
                "single-shared"
            },
        )
    }
}

/// Counters, printed on exit.
#[derive(Default, Debug)]
pub struct Stats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub seeks: AtomicU64,
    pub meta_ops: AtomicU64,
    /// Sum over requests of (deadline - arrival), microseconds.
    pub delay_us: AtomicU64,
    /// Replies that were ready only after their deadline (the real backing I/O took longer than
    /// the emulated cost), and by how much in total: non-zero means the emulation was not met.
    pub late: AtomicU64,
    pub late_us: AtomicU64,
}

impl Stats {
    pub fn json(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{{\"reads\":{},\"writes\":{},\"bytes_read\":{},\"bytes_written\":{},\"seeks\":{},\
             \"meta_ops\":{},\"emulated_delay_us\":{},\"late_replies\":{},\"late_us\":{}}}",
            g(&self.reads),
            g(&self.writes),
            g(&self.bytes_read),
            g(&self.bytes_written),
            g(&self.seeks),
            g(&self.meta_ops),
            g(&self.delay_us),
            g(&self.late),
            g(&self.late_us)
        )
    }
}

struct Device {
    /// [read, write] when duplex; only [0] used otherwise.
    free: [Instant; 2],
    /// End offset of the previous data access, per inode.
    last_end: HashMap<u64, u64>,
    /// (inode, end offset) of the previous data access on the whole device.
    head: Option<(u64, u64)>,
}

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Pending {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    // Reversed: BinaryHeap is a max-heap, we want the earliest deadline on top.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        o.at.cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

pub struct Emu {
    pub p: Params,
    pub stats: std::sync::Arc<Stats>,
    dev: Mutex<Device>,
    tx: Option<Sender<Pending>>,
    seq: AtomicU64,
}

impl Emu {
    pub fn new(p: Params, stats: std::sync::Arc<Stats>) -> Emu {
        let tx = if p.is_zero() {
            None
        } else {
            let (tx, rx) = mpsc::channel::<Pending>();
            std::thread::Builder::new()
                .name("slowfs-timer".into())
                .spawn(move || timer_thread(rx))
                .expect("spawn timer thread");
            Some(tx)
        };
        let now = Instant::now();
        Emu {
            p,
            stats,
            dev: Mutex::new(Device {
                free: [now, now],
                last_end: HashMap::new(),
                head: None,
            }),
            tx,
            seq: AtomicU64::new(0),
        }
    }

    /// Deadline of a metadata request that arrived at `t0`.
    pub fn meta_deadline(&self, t0: Instant) -> Instant {
        self.stats.meta_ops.fetch_add(1, Ordering::Relaxed);
        t0 + self.p.latency + self.p.meta
    }

    /// Deadline of a data request that arrived at `t0` and moved `bytes` at `offset` of `ino`.
    pub fn data_deadline(
        &self,
        t0: Instant,
        ino: u64,
        offset: u64,
        bytes: u64,
        write: bool,
    ) -> Instant {
        if write {
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        }
        if self.tx.is_none() {
            return t0;
        }
        let xfer = if self.p.bandwidth == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos(
                ((bytes as u128 * 1_000_000_000) / self.p.bandwidth as u128).min(u64::MAX as u128)
                    as u64,
            )
        };
        let ready = t0 + self.p.latency;
        let idx = usize::from(self.p.duplex && write);
        let mut dev = self.dev.lock().unwrap();
        let sequential = match self.p.seek_model {
            SeekModel::PerFile => dev.last_end.get(&ino) == Some(&offset),
            SeekModel::Head => dev.head == Some((ino, offset)),
        };
        dev.last_end.insert(ino, offset + bytes);
        dev.head = Some((ino, offset + bytes));
        let free = dev.free[idx];
        let start = if sequential && free <= ready && ready - free <= self.p.stream_gap {
            free
        } else {
            ready.max(free)
        };
        let mut busy = xfer;
        if !sequential && !self.p.seek.is_zero() {
            busy += self.p.seek;
            self.stats.seeks.fetch_add(1, Ordering::Relaxed);
        }
        let finish = start + busy;
        dev.free[idx] = finish;
        finish
    }

    /// Run `reply` at `deadline` (immediately when emulation is off or the deadline passed).
    pub fn reply_at<F: FnOnce() + Send + 'static>(&self, t0: Instant, deadline: Instant, reply: F) {
        let now = Instant::now();
        if deadline > t0 {
            self.stats
                .delay_us
                .fetch_add((deadline - t0).as_micros() as u64, Ordering::Relaxed);
            if deadline < now {
                self.stats.late.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .late_us
                    .fetch_add((now - deadline).as_micros() as u64, Ordering::Relaxed);
            }
        }
        match &self.tx {
            Some(tx) if deadline > now => {
                let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                let p = Pending {
                    at: deadline,
                    seq,
                    job: Box::new(reply),
                };
                if let Err(mpsc::SendError(p)) = tx.send(p) {
                    (p.job)();
                }
            }
            _ => reply(),
        }
    }
}

fn timer_thread(rx: Receiver<Pending>) {
    // Default timer slack is 50 us; we want sub-50 us wakeups for 0.5 ms latencies.
    // SAFETY: prctl with PR_SET_TIMERSLACK only affects the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
    // Replies must leave on time even when the benchmarked client keeps both CPUs busy: run this
    // thread (tiny work: send a prepared reply) SCHED_FIFO when allowed (root).
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: valid sched_param for the calling thread.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc != 0 {
        eprintln!(
            "tierfs-slowfs: timer thread not real-time ({}); reply timing may jitter under load",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    let mut heap: BinaryHeap<Pending> = BinaryHeap::new();
    loop {
        // Fire everything that is due.
        let now = Instant::now();
        while heap.peek().is_some_and(|p| p.at <= now) {
            let p = heap.pop().unwrap();
            (p.job)();
        }
        let got = match heap.peek() {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(p) => rx.recv_timeout(p.at.saturating_duration_since(Instant::now())),
        };
        match got {
            Ok(p) => {
                heap.push(p);
                // Drain whatever else is queued without blocking.
                while let Ok(p) = rx.try_recv() {
                    heap.push(p);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // Emulator gone: send what is left at its deadline, then stop.
                while let Some(p) = heap.pop() {
                    std::thread::sleep(p.at.saturating_duration_since(Instant::now()));
                    (p.job)();
                }
                return;
            }
        }
    }
}
