//! One connection: an `ssh -s HOST sftp` child process, its stdin and stdout carrying sftp
//! packets. Requests are numbered by the client library and answered in any order, so any
//! number of threads send on the one connection at once, each waiting for its own answer
//! (pipelining: a 4 MiB read is 17 READs on the wire together, not one after another).
//!
//! A writer task sends what the callers queued (everything queued meanwhile in one write: no
//! timer, no added latency), a reader task hands each answer to its waiter. Every wait has a
//! deadline (`sftp.timeout`): a server that does not answer in time is taken as hung, the
//! connection is dropped (ssh killed), and every waiter gets ENOTCONN at once, which the core
//! reads as "store gone" (it serves what is cached and calls `Store::reconnect`).

use crate::config::SftpConfig;
use crate::errors::{status, Status};
use crate::stats::{InFlight, SftpStats};
use bytes::{Bytes, BytesMut};
use openssh_sftp_client_lowlevel as ll;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use std::num::NonZeroUsize;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tierfs_store::Errno;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};

pub(crate) type Buf = BytesMut;
pub(crate) type WriteEnd = ll::WriteEnd<Buf, OutQueue, ()>;
pub(crate) type Id = ll::Id<Buf>;
type SharedData = ll::SharedData<Buf, OutQueue, ()>;
type ReadEnd = ll::ReadEnd<ChildStdout, Buf, OutQueue, ()>;

/// How long ssh may take to log in and start sftp-server, at most (ssh's own ConnectTimeout
/// covers the TCP connect; this covers the rest, e.g. a server that accepts and says nothing).
const HANDSHAKE: Duration = Duration::from_secs(15);
/// Lines of ssh's stderr kept, for the message when it fails.
const STDERR_LINES: usize = 8;

/// Serialized requests waiting for the writer task.
#[derive(Default)]
pub(crate) struct OutQueue {
    bufs: Mutex<Vec<Bytes>>,
    wake: Notify,
}

impl ll::Queue for OutQueue {
    fn push(&self, bytes: Bytes) {
        self.bufs.lock().push(bytes);
        self.wake.notify_one();
    }

    fn extend(&self, header: Bytes, body: &[&[Bytes]]) {
        let mut q = self.bufs.lock();
        q.push(header);
        q.extend(body.iter().flat_map(|b| b.iter()).cloned());
        drop(q);
        self.wake.notify_one();
    }
}

/// Set once the connection is unusable: every waiter is woken with ENOTCONN.
#[derive(Default)]
struct Dead {
    flag: AtomicBool,
    notify: Notify,
    child: Mutex<Option<Child>>,
}

impl Dead {
    /// Marks the connection dead (`why`: logged; None: closed on purpose, quietly).
    fn set(&self, host: &str, why: Option<&str>) {
        if !self.flag.swap(true, Relaxed) {
            if let Some(why) = why {
                tracing::warn!("sftp connection to {host} lost: {why}");
            }
        }
        if let Some(c) = self.child.lock().as_mut() {
            let _ = c.start_kill();
        }
        self.notify.notify_waiters();
    }

    async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.flag.load(Relaxed) {
                return;
            }
            n.await;
        }
    }
}

/// A request on the wire: its answer, the slot it holds, and when it was sent.
pub(crate) struct Pending<'a, F> {
    fut: F,
    sent: Instant,
    _slot: SemaphorePermit<'a>,
    _counted: InFlight<'a>,
}

pub(crate) struct Conn {
    we: WriteEnd,
    slots: Semaphore,
    timeout: Duration,
    dead: Arc<Dead>,
    host: String,
    stats: Arc<SftpStats>,
    pub(crate) ext: ll::Extensions,
    /// The longest READ and WRITE the server takes (limits@openssh.com).
    pub(crate) read_len: u32,
    pub(crate) write_len: u32,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.dead.set(&self.host, None);
    }
}

impl Conn {
    /// Starts ssh and speaks sftp's hello; the error is one line for the user (ssh's own last
    /// words where it said any: "Connection refused", "Permission denied (publickey)").
    pub(crate) async fn start(cfg: &SftpConfig, stats: Arc<SftpStats>) -> Result<Conn, String> {
        let host = cfg.url.display();
        let mut cmd = tokio::process::Command::new(&cfg.ssh);
        cmd.args(cfg.ssh_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C meant for a foreground `tierfs mount` must not
            // kill ssh before the daemon has written its write-back data out through it.
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", cfg.ssh))?;
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => return Err("ssh: no pipes".into()),
            };
        let said = Arc::new(Mutex::new(VecDeque::<String>::new()));
        {
            let said = said.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    tracing::info!("ssh: {l}");
                    let mut s = said.lock();
                    if s.len() == STDERR_LINES {
                        s.pop_front();
                    }
                    s.push_back(l);
                }
            });
        }
        let dead = Arc::new(Dead::default());
        let we: WriteEnd = ll::connect(OutQueue::default(), ()).map_err(|e| e.to_string())?;
        let mut re: ReadEnd = ll::ReadEnd::new(
            stdout,
            NonZeroUsize::new(256 << 10).expect("non-zero"),
            SharedData::clone(&we),
        );
        tokio::spawn(writer(
            SharedData::clone(&we),
            stdin,
            dead.clone(),
            host.clone(),
        ));
        let hello = tokio::time::timeout(HANDSHAKE, re.receive_server_hello()).await;
        let ext = match hello {
            Ok(Ok(ext)) => ext,
            failed => {
                let _ = child.start_kill();
                // ssh's last words reach the stderr task just before or after its exit.
                let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                let last = said
                    .lock()
                    .iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .cloned();
                return Err(match (failed, last) {
                    (Err(_), _) => {
                        format!("{host}: no sftp answer within {} s", HANDSHAKE.as_secs())
                    }
                    (_, Some(l)) => format!("{host}: {}", l.trim()),
                    (Ok(Err(e)), None) => format!("{host}: ssh failed ({e})"),
                    (Ok(Ok(_)), None) => unreachable!(),
                });
            }
        };
        *dead.child.lock() = Some(child);
        tokio::spawn(reader(re, dead.clone(), host.clone()));
        let mut conn = Conn {
            we,
            slots: Semaphore::new(cfg.max_in_flight.max(1)),
            timeout: cfg.timeout,
            dead,
            host,
            stats,
            ext,
            read_len: ll::OPENSSH_PORTABLE_DEFAULT_DOWNLOAD_BUFLEN as u32,
            write_len: ll::OPENSSH_PORTABLE_DEFAULT_UPLOAD_BUFLEN as u32,
        };
        if ext.contains(ll::Extensions::LIMITS) {
            let l = conn
                .call(|we, id| Ok(we.send_limits_request(id)?.wait()))
                .await
                .map_err(|e| format!("{}: limits@openssh.com: {}", conn.host, e.errno()))?;
            // Room for the READ/WRITE header in a packet of packet_len.
            let cap = |n: u64| {
                let packet = if l.packet_len == 0 {
                    u64::MAX
                } else {
                    l.packet_len
                };
                n.min(packet.saturating_sub(1024)).clamp(4096, 16 << 20) as u32
            };
            if l.read_len > 0 {
                conn.read_len = cap(l.read_len);
            }
            if l.write_len > 0 {
                conn.write_len = cap(l.write_len);
            }
        }
        Ok(conn)
    }

    pub(crate) fn alive(&self) -> bool {
        !self.dead.flag.load(Relaxed)
    }

    /// Drops the connection: ssh is killed, every waiter answered ENOTCONN.
    pub(crate) fn kill(&self, why: &str) {
        self.dead.set(&self.host, Some(why));
    }

    /// Closes the connection on purpose (ssh killed, nothing logged).
    pub(crate) fn close(&self) {
        self.dead.set(&self.host, None);
    }

    pub(crate) fn has(&self, e: ll::Extensions) -> bool {
        self.ext.contains(e)
    }

    /// A slot for one request, waiting while `sftp.max_in_flight` are on the wire.
    async fn slot(&self) -> Result<SemaphorePermit<'_>, Status> {
        if !self.alive() {
            return Err(Errno::ENOTCONN.into());
        }
        tokio::select! {
            p = self.slots.acquire() => p.map_err(|_| Errno::ENOTCONN.into()),
            _ = self.dead.wait() => Err(Errno::ENOTCONN.into()),
        }
    }

    /// Puts one request on the wire; `make` serializes it under the id given.
    fn push<'a, F>(
        &'a self,
        slot: SemaphorePermit<'a>,
        make: impl FnOnce(&mut WriteEnd, Id) -> Result<F, ll::Error>,
    ) -> Result<Pending<'a, F>, Status> {
        let mut we = self.we.clone();
        let id = we.create_response_id();
        let fut = make(&mut we, id).map_err(|e| status(&e))?;
        Ok(Pending {
            fut,
            sent: Instant::now(),
            _slot: slot,
            _counted: InFlight::new(&self.stats),
        })
    }

    /// Sends a request whose answer nobody waits for (the CLOSE of a dropped handle): no
    /// slot, so it can be sent from any thread without blocking.
    pub(crate) fn send_detached<F>(
        &self,
        make: impl FnOnce(&mut WriteEnd, Id) -> Result<F, ll::Error>,
    ) {
        if self.alive() {
            let mut we = self.we.clone();
            let id = we.create_response_id();
            self.stats.requests.fetch_add(1, Relaxed);
            // Dropped unanswered: the reader frees its id when the answer comes.
            let _ = make(&mut we, id);
        }
    }

    /// The answer of `p`, within `sftp.timeout` of its sending.
    pub(crate) async fn wait<T, F>(&self, p: Pending<'_, F>) -> Result<T, Status>
    where
        F: Future<Output = Result<(Id, T), ll::Error>>,
    {
        let deadline = p.sent + self.timeout;
        let fut = p.fut;
        tokio::select! {
            biased;
            r = fut => r.map(|(_, v)| v).map_err(|e| status(&e)),
            _ = self.dead.wait() => Err(Errno::ENOTCONN.into()),
            _ = tokio::time::sleep_until(deadline.into()) => {
                self.stats.timeouts.fetch_add(1, Relaxed);
                self.kill(&format!(
                    "a request had no answer within {} s (sftp.timeout): the server is taken as hung",
                    self.timeout.as_secs_f64()
                ));
                Err(Errno::ENOTCONN.into())
            }
        }
    }

    /// One request and its answer.
    pub(crate) async fn call<T, F>(
        &self,
        make: impl FnOnce(&mut WriteEnd, Id) -> Result<F, ll::Error>,
    ) -> Result<T, Status>
    where
        F: Future<Output = Result<(Id, T), ll::Error>>,
    {
        let slot = self.slot().await?;
        let p = self.push(slot, make)?;
        self.wait(p).await
    }

    /// Two requests sent together (one round trip: the server answers in order, so the
    /// second sees what the first did), both answers. The second waits for a slot only
    /// after the first is answered.
    pub(crate) async fn pair<T, U, F, G>(
        &self,
        first: impl FnOnce(&mut WriteEnd, Id) -> Result<F, ll::Error>,
        second: impl FnOnce(&mut WriteEnd, Id) -> Result<G, ll::Error>,
    ) -> (Result<T, Status>, Result<U, Status>)
    where
        F: Future<Output = Result<(Id, T), ll::Error>>,
        G: Future<Output = Result<(Id, U), ll::Error>>,
    {
        let p = match self.slot().await {
            Ok(s) => self.push(s, first),
            Err(e) => return (Err(e), Err(e)),
        };
        let p = match p {
            Ok(p) => p,
            Err(e) => return (Err(e), Err(e)),
        };
        match self.slots.try_acquire() {
            Ok(s) => {
                let q = self.push(s, second);
                let a = self.wait(p).await;
                let b = match q {
                    Ok(q) => self.wait(q).await,
                    Err(e) => Err(e),
                };
                (a, b)
            }
            Err(_) => {
                let a = self.wait(p).await;
                (a, self.call(second).await)
            }
        }
    }

    /// `n` requests (`make(i, ..)` serializes the i-th), as many on the wire at once as there
    /// are slots, each answer given to `done(i, ..)` in order. A request waits for a slot
    /// only once none of its batch's own is left to be answered (so batches never hold
    /// slots while waiting for more: no deadlock between them).
    pub(crate) async fn pipeline<T, F>(
        &self,
        n: usize,
        make: impl FnMut(usize, &mut WriteEnd, Id) -> Result<F, ll::Error>,
        done: impl FnMut(usize, Result<T, Status>),
    ) -> Result<(), Status>
    where
        F: Future<Output = Result<(Id, T), ll::Error>>,
    {
        let none = None::<fn(&mut WriteEnd, Id) -> Result<F, ll::Error>>;
        self.pipeline_then(n, make, done, none).await.map(|_| ())
    }

    /// [`Conn::pipeline`], and one more request sent after the `n` (before their answers
    /// are awaited, so in the same round trip; the server answers in order, so it sees what
    /// they did): its answer, if `then` was given.
    pub(crate) async fn pipeline_then<T, U, F, G>(
        &self,
        n: usize,
        mut make: impl FnMut(usize, &mut WriteEnd, Id) -> Result<F, ll::Error>,
        mut done: impl FnMut(usize, Result<T, Status>),
        then: Option<impl FnOnce(&mut WriteEnd, Id) -> Result<G, ll::Error>>,
    ) -> Result<Option<Result<U, Status>>, Status>
    where
        F: Future<Output = Result<(Id, T), ll::Error>>,
        G: Future<Output = Result<(Id, U), ll::Error>>,
    {
        let mut q = VecDeque::new();
        for i in 0..n {
            let slot = loop {
                if let Ok(s) = self.slots.try_acquire() {
                    break s;
                }
                match q.pop_front() {
                    Some((j, p)) => done(j, self.wait(p).await),
                    None => break self.slot().await?,
                }
            };
            q.push_back((i, self.push(slot, |we, id| make(i, we, id))?));
        }
        let last = match then {
            Some(then) => {
                let slot = loop {
                    if let Ok(s) = self.slots.try_acquire() {
                        break s;
                    }
                    match q.pop_front() {
                        Some((j, p)) => done(j, self.wait(p).await),
                        None => break self.slot().await?,
                    }
                };
                Some(self.push(slot, then)?)
            }
            None => None,
        };
        while let Some((j, p)) = q.pop_front() {
            done(j, self.wait(p).await);
        }
        Ok(match last {
            Some(p) => Some(self.wait(p).await),
            None => None,
        })
    }
}

/// Sends what is queued, all of it in one write where it can: requests queued while a write
/// was under way go out together in the next.
async fn writer(shared: SharedData, stdin: ChildStdin, dead: Arc<Dead>, host: String) {
    let mut w = BufWriter::with_capacity(256 << 10, stdin);
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            _ = shared.queue().wake.notified() => {}
            _ = dead.wait() => return,
        }
        loop {
            std::mem::swap(&mut batch, &mut *shared.queue().bufs.lock());
            if batch.is_empty() {
                break;
            }
            for b in batch.drain(..) {
                if let Err(e) = w.write_all(&b).await {
                    return dead.set(&host, Some(&format!("writing to ssh: {e}")));
                }
            }
        }
        if let Err(e) = w.flush().await {
            return dead.set(&host, Some(&format!("writing to ssh: {e}")));
        }
    }
}

/// Hands each answer to its waiter until the connection ends.
async fn reader(mut re: ReadEnd, dead: Arc<Dead>, host: String) {
    loop {
        tokio::select! {
            r = re.read_in_one_packet() => if let Err(e) = r {
                return dead.set(&host, Some(&format!("reading from ssh: {e}")));
            },
            _ = dead.wait() => return,
        }
    }
}
