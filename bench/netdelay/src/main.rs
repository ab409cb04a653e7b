//! tierfs-netdelay: a TCP relay that adds a fixed one-way delay in each direction, for
//! benchmarking over a network link with a round trip the kernel cannot add here (no `netem`).
//!
//! Every accepted connection gets a connection to `--connect`; per direction a reader thread
//! reads what arrives (up to 256 KiB at a time), stamps it with its arrival time and queues it;
//! a writer thread sends each chunk once `arrival + delay` has passed. A large chunk's buffer
//! goes back to the reader once sent and is read into again: the relay is the emulated link
//! and shares the CPUs with what it measures, so it must cost as little per byte as it can
//! (a fresh buffer per chunk cost it page faults and a copy: 26% of both CPUs during a 1 GiB
//! S3 read through it). The two are pipelined,
//! so the delay is added to every byte without capping throughput (the queue is bounded only to
//! keep a stalled peer from growing it without end). `--stats` serves the byte counters as one
//! JSON line to whoever connects there.
//!
//! A new connection costs a round trip on a real link before its first byte can leave (SYN,
//! SYN-ACK); here the kernel accepts it on loopback at once. So what a client sends first is
//! held until a round trip after the accept has passed, then delayed as any byte: a client
//! that connects anew for each request pays what it would pay over the link.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
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

/// A chunk read from one side, with the time it arrived; `None` data = end of stream.
struct Chunk {
    at: Instant,
    data: Option<Vec<u8>>,
}

fn reader(mut src: TcpStream, tx: SyncSender<Chunk>, back: Receiver<Vec<u8>>, chunk: usize) {
    let mut buf = vec![0u8; chunk];
    loop {
        match src.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = tx.send(Chunk {
                    at: Instant::now(),
                    data: None,
                });
                return;
            }
            Ok(n) => {
                // A small chunk (a request, an ack) is copied out and the buffer kept; a large
                // one is sent as it is, and a buffer the writer has sent comes back for the
                // next read (a queue of small chunks never holds large buffers).
                let data = if n < chunk / 4 {
                    buf[..n].to_vec()
                } else {
                    let mut next = back.try_recv().unwrap_or_else(|_| vec![0u8; chunk]);
                    next.resize(chunk, 0);
                    let mut full = std::mem::replace(&mut buf, next);
                    full.truncate(n);
                    full
                };
                let c = Chunk {
                    at: Instant::now(),
                    data: Some(data),
                };
                if tx.send(c).is_err() {
                    return; // the writer gave up: its peer is gone
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn writer(
    mut dst: TcpStream,
    src: TcpStream,
    rx: Receiver<Chunk>,
    back: SyncSender<Vec<u8>>,
    chunk: usize,
    delay: Duration,
    not_before: Instant,
    bytes: &AtomicU64,
    c: &Counters,
) {
    let late = delay + Duration::from_millis(1);
    for Chunk { at, data } in rx {
        let due = at.max(not_before) + delay;
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        } else if now - at > late {
            c.late_chunks.fetch_add(1, Relaxed);
        }
        match data {
            Some(d) => {
                if dst.write_all(&d).is_err() {
                    break;
                }
                bytes.fetch_add(d.len() as u64, Relaxed);
                c.chunks.fetch_add(1, Relaxed);
                if d.capacity() >= chunk {
                    let _ = back.try_send(d); // full or reader gone: dropped
                }
            }
            None => {
                // The sending side closed: pass the half-close on, after the delay.
                let _ = dst.shutdown(Shutdown::Write);
                return;
            }
        }
    }
    // The receiving side is gone: stop reading from the sender too, so both ends close.
    let _ = src.shutdown(Shutdown::Both);
    let _ = dst.shutdown(Shutdown::Both);
}

fn relay(client: TcpStream, args: &Args, c: Arc<Counters>) {
    let accepted = Instant::now();
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
    let delay = Duration::from_micros(args.delay_us);
    c.connections.fetch_add(1, Relaxed);
    c.active.fetch_add(1, Relaxed);
    let mut handles = Vec::new();
    for up in [true, false] {
        let (from, to) = if up {
            (&client, &server)
        } else {
            (&server, &client)
        };
        let (tx, rx) = sync_channel::<Chunk>(args.queue);
        // Sent buffers on their way back to the reader: a few are enough to go round.
        let (back_tx, back_rx) = sync_channel::<Vec<u8>>(8);
        let (r_src, w_dst, w_src) = match (from.try_clone(), to.try_clone(), from.try_clone()) {
            (Ok(a), Ok(b), Ok(d)) => (a, b, d),
            _ => {
                eprintln!("tierfs-netdelay: cannot clone a socket");
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
                c.active.fetch_sub(1, Relaxed);
                return;
            }
        };
        let chunk = args.chunk;
        handles.push(thread::spawn(move || reader(r_src, tx, back_rx, chunk)));
        let cw = c.clone();
        // The handshake: the client's first byte leaves once the SYN-ACK is back (a round
        // trip), and reaches the server a one-way delay later, when the server has the
        // connection; what the server sends first (an SSH banner) leaves then.
        let not_before = accepted + if up { 2 * delay } else { 3 * delay };
        handles.push(thread::spawn(move || {
            let bytes = if up { &cw.bytes_up } else { &cw.bytes_down };
            writer(
                w_dst, w_src, rx, back_tx, chunk, delay, not_before, bytes, &cw,
            );
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
                thread::spawn(move || relay(client, &a, c2));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("tierfs-netdelay: accept: {e}");
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The time from connecting (or from sending, on a connection already open) to the
    /// first byte of the echo server's answer to `b"ping"`.
    fn answer_after(s: &mut TcpStream, t: Instant) -> Duration {
        s.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        t.elapsed()
    }

    #[test]
    fn a_request_costs_a_round_trip_and_a_new_connection_one_more() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        thread::spawn(move || {
            for mut s in echo.incoming().flatten() {
                thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        // Long enough that a loaded machine's scheduling (the suite runs beside it) stays
        // well inside one delay.
        let delay = Duration::from_millis(50);
        let args = Arc::new(Args::parse_from([
            "tierfs-netdelay",
            "--listen",
            &front_addr.to_string(),
            "--connect",
            &echo_addr.to_string(),
            "--delay-us",
            &delay.as_micros().to_string(),
        ]));
        thread::spawn(move || {
            for client in front.incoming().flatten() {
                let a = args.clone();
                thread::spawn(move || relay(client, &a, Arc::new(Counters::default())));
            }
        });
        let t = Instant::now();
        let mut s = TcpStream::connect(front_addr).unwrap();
        s.set_nodelay(true).unwrap();
        // The handshake's round trip, then the request's: four one-way delays.
        let first = answer_after(&mut s, t);
        assert!(
            first >= 4 * delay,
            "first answer on a new connection after {first:?}"
        );
        // On the open connection: one round trip (a handshake charged again would be two).
        let again = answer_after(&mut s, Instant::now());
        assert!(
            again >= 2 * delay && again < 4 * delay,
            "answer on an open connection after {again:?}"
        );
    }
}
