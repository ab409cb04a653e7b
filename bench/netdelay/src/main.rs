//! tierfs-netdelay: a TCP relay that adds a fixed one-way delay in each direction, for
//! benchmarking over a network link with a round trip the kernel cannot add here (no `netem`).
//!
//! Every accepted connection gets a connection to `--connect`; per direction one thread reads
//! what arrives (up to 256 KiB at a time), stamps it with its arrival time, queues it, and
//! sends each chunk once `arrival + delay` has passed, waiting in one `ppoll` for whichever
//! comes first. The relay is the emulated link and shares the CPUs with what it measures, so
//! it must cost as little per byte and per request as it can: a real link costs the hosts
//! nothing. A large chunk's buffer is read into again once sent (a fresh buffer per chunk cost
//! page faults and a copy: 26% of both CPUs during a 1 GiB S3 read), and there is no hand-off
//! between threads (a reader and a writer thread per direction cost 0.69 ms of CPU per S3
//! request round trip). Reading goes on while chunks wait, so the delay is added to every
//! byte without capping throughput (the queue is bounded only to keep a stalled peer from
//! growing it without end). `--stats` serves the byte counters as one
//! JSON line to whoever connects there.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "tierfs-netdelay",
    about = "TCP relay adding a fixed one-way delay in each direction (pipelined, no rate cap)"
)]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:2222.
    #[arg(long)]
    listen: SocketAddr,
    /// Address every accepted connection is relayed to, e.g. 10.77.0.2:22.
    #[arg(long)]
    connect: SocketAddr,
    /// One-way delay added in each direction, microseconds (round trip: twice this).
    #[arg(long, default_value_t = 2000)]
    delay_us: u64,
    /// Optional address serving the counters as one JSON line per connection.
    #[arg(long)]
    stats: Option<SocketAddr>,
    /// Largest chunk one read takes from a socket, bytes.
    #[arg(long, default_value_t = 256 << 10)]
    chunk: usize,
    /// Chunks queued per direction before the reader waits for the writer.
    #[arg(long, default_value_t = 1024)]
    queue: usize,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    active: AtomicU64,
    /// Client to server (what the relay's clients send: requests, written data).
    bytes_up: AtomicU64,
    /// Server to client (replies, read data).
    bytes_down: AtomicU64,
    chunks: AtomicU64,
    /// Chunks sent later than `arrival + delay + 1 ms` (a busy CPU, a slow peer).
    late_chunks: AtomicU64,
}

impl Counters {
    fn json(&self, delay_us: u64) -> String {
        format!(
            "{{\"delay_us\":{},\"connections\":{},\"active\":{},\"bytes_up\":{},\
             \"bytes_down\":{},\"chunks\":{},\"late_chunks\":{}}}\n",
            delay_us,
            self.connections.load(Relaxed),
            self.active.load(Relaxed),
            self.bytes_up.load(Relaxed),
            self.bytes_down.load(Relaxed),
            self.chunks.load(Relaxed),
            self.late_chunks.load(Relaxed),
        )
    }
}

/// Big buffers kept for reuse per direction (sent chunks come back to be read into).
const SPARE_BUFFERS: usize = 8;

/// One direction of a connection, in one thread: reads what `src` sends, stamps each chunk
/// with its arrival, and writes it to `dst` once `arrival + delay` has passed. The thread
/// waits in one `ppoll` for whichever comes first, more data or the next chunk's due time:
/// no hand-off between a reader and a writer thread (that cost two extra thread switches per
/// chunk, 0.69 ms of CPU per S3 request round trip, as much as tierfs itself spent).
fn direction(mut src: TcpStream, mut dst: TcpStream, args: &Args, bytes: &AtomicU64, c: &Counters) {
    use std::collections::VecDeque;
    use std::os::fd::AsRawFd;
    let (delay, chunk) = (Duration::from_micros(args.delay_us), args.chunk);
    let late = delay + Duration::from_millis(1);
    // (arrival, data); None = the sender closed: passed on as a half-close, after the delay.
    let mut q: VecDeque<(Instant, Option<Vec<u8>>)> = VecDeque::new();
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; chunk];
    let mut eof = false;
    loop {
        let now = Instant::now();
        while let Some(&(at, _)) = q.front() {
            if at + delay > now {
                break;
            }
            if now - at > late {
                c.late_chunks.fetch_add(1, Relaxed);
            }
            let Some((_, data)) = q.pop_front() else {
                break;
            };
            let Some(d) = data else {
                let _ = dst.shutdown(Shutdown::Write);
                return;
            };
            if dst.write_all(&d).is_err() {
                // The receiving side is gone: stop reading from the sender too.
                let _ = src.shutdown(Shutdown::Both);
                let _ = dst.shutdown(Shutdown::Both);
                return;
            }
            bytes.fetch_add(d.len() as u64, Relaxed);
            c.chunks.fetch_add(1, Relaxed);
            if d.capacity() >= chunk && spare.len() < SPARE_BUFFERS {
                spare.push(d);
            }
        }
        // Read while the queue has room (a stalled receiver holds the sender back).
        let reading = !eof && q.len() < args.queue;
        let wait = q
            .front()
            .map(|&(at, _)| (at + delay).saturating_duration_since(Instant::now()));
        let ts = wait.map(|w| libc::timespec {
            tv_sec: w.as_secs() as libc::time_t,
            tv_nsec: w.subsec_nanos() as libc::c_long,
        });
        let mut pfd = libc::pollfd {
            fd: src.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let n = unsafe {
            libc::ppoll(
                &mut pfd,
                reading as libc::nfds_t,
                ts.as_ref().map_or(std::ptr::null(), |t| t as *const _),
                std::ptr::null(),
            )
        };
        if n < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            eprintln!(
                "tierfs-netdelay: ppoll: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        if !reading || n <= 0 || pfd.revents == 0 {
            continue;
        }
        match src.read(&mut buf) {
            Ok(0) | Err(_) => {
                eof = true;
                q.push_back((Instant::now(), None));
            }
            Ok(n) => {
                // A small chunk (a request, an ack) is copied out and the buffer kept; a
                // large one is queued as it is, and a sent buffer is read into next.
                let data = if n < chunk / 4 {
                    buf[..n].to_vec()
                } else {
                    let mut next = spare.pop().unwrap_or_else(|| vec![0u8; chunk]);
                    next.resize(chunk, 0);
                    let mut full = std::mem::replace(&mut buf, next);
                    full.truncate(n);
                    full
                };
                q.push_back((Instant::now(), Some(data)));
            }
        }
    }
}

fn relay(client: TcpStream, args: Arc<Args>, c: Arc<Counters>) {
    let server = match TcpStream::connect_timeout(&args.connect, Duration::from_secs(10)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tierfs-netdelay: connect {}: {e}", args.connect);
            return;
        }
    };
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
    }
    c.connections.fetch_add(1, Relaxed);
    c.active.fetch_add(1, Relaxed);
    let mut handles = Vec::new();
    for up in [true, false] {
        let (from, to) = if up {
            (&client, &server)
        } else {
            (&server, &client)
        };
        let (Ok(src), Ok(dst)) = (from.try_clone(), to.try_clone()) else {
            eprintln!("tierfs-netdelay: cannot clone a socket");
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            break;
        };
        let (a, cw) = (args.clone(), c.clone());
        handles.push(thread::spawn(move || {
            let bytes = if up { &cw.bytes_up } else { &cw.bytes_down };
            direction(src, dst, &a, bytes, &cw);
        }));
    }
    for h in handles {
        let _ = h.join();
    }
    c.active.fetch_sub(1, Relaxed);
}

fn serve_stats(addr: SocketAddr, c: Arc<Counters>, delay_us: u64) {
    let l = match TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tierfs-netdelay: stats listener {addr}: {e}");
            std::process::exit(1);
        }
    };
    for mut s in l.incoming().flatten() {
        let _ = s.write_all(c.json(delay_us).as_bytes());
    }
}

fn main() {
    let args = Arc::new(Args::parse());
    if args.chunk == 0 || args.queue == 0 {
        eprintln!("tierfs-netdelay: --chunk and --queue must be positive");
        std::process::exit(2);
    }
    let listener = match TcpListener::bind(args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("tierfs-netdelay: listen {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let c = Arc::new(Counters::default());
    if let Some(addr) = args.stats {
        let (c2, d) = (c.clone(), args.delay_us);
        thread::spawn(move || serve_stats(addr, c2, d));
    }
    eprintln!(
        "tierfs-netdelay: listening on {}, relaying to {}, {} us each way",
        args.listen, args.connect, args.delay_us
    );
    loop {
        match listener.accept() {
            Ok((client, _)) => {
                let (a, c2) = (args.clone(), c.clone());
                thread::spawn(move || relay(client, a, c2));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("tierfs-netdelay: accept: {e}");
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
