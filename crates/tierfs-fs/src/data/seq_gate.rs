//! One backing read at a time for a sequential stream, and the lowest offset first.
//!
//! On one disk head two reads of a stream in flight interleave and cost a seek each, so a
//! stream's backing reads go one at a time (see `fetch_run`). One at a time is not enough:
//! the read-ahead worker that claimed chunk N+1 and the reader or worker that claimed chunk N
//! may reach the store in either order when both wait for the same lock, and every inversion
//! is a seek there and another back. Measured over the hdd emulator (8 ms seeks, 150 MB/s)
//! with a plain mutex: `md5sum` of a 1 GiB file made 663 backing reads, 182 of them out of
//! order, and ran at 115 MB/s against the store's own 149. The gate lets the waiter with the
//! lowest offset go next; a fetch takes its place in the queue ([`SeqGate::ticket`]) as soon
//! as it has claimed its blocks, before it looks in the SSD tier, so that a read-ahead worker
//! claiming the chunk after it a moment later cannot overtake it at the store (a plain queue
//! at the gate still let 30 of 800 reads through out of order). Tickets are not enough
//! either: the kernel sends a stream's reads in order, but the FUSE threads that take them up
//! race, and the one with the later read may claim its blocks first. So a read that would
//! leave a gap after the stream's last read (at most [`LATE_SPAN`] ahead) waits up to
//! [`LATE_WAIT`] for the read that fills it, and at most a quarter of what the stream's last
//! read took (so a fast store, where a gap costs little, waits little): less than a seek
//! costs (8 ms on a disk), and never at all while the stream keeps to its order. Traced (strace of the daemon's reads
//! of the backing file, same test): a plain mutex 182 of 663 reads out of order, the ordered
//! queue 30 of 800, with tickets 21 of 812, with the gap wait 3 of 674 (those while
//! read-ahead measured two reads in flight, see `stream_depth`). `md5sum` went from
//! 115-130 MB/s to 136-142 (store 149). What is left is below tierfs: the kernel splits
//! each 4 MiB read of a FUSE store into 1 MiB requests that reach the store's threads in
//! any order (the emulator counted 43 seeks).

use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a read that would leave a gap after the stream's last one waits for the read
/// that fills it.
pub(crate) const LATE_WAIT: Duration = Duration::from_millis(2);
/// Only a gap up to this far counts as a read that is late (a longer jump is the reader's).
pub(crate) const LATE_SPAN: u64 = 16 << 20;
/// The longest a read waits for a lower one queued ahead of it that does not come (its
/// blocks came from the SSD tier, it failed, its thread is slow): the order is worth a seek,
/// never a stall. (A queued place held while its owner waited for another reader's fetch,
/// itself queued behind it, held a file's reads for good: the kernel's page drop waited on
/// them, and `never_a_mix_after_in_place_rewrite_cto_off` saw ESTALE for seconds.)
pub(crate) const QUEUE_WAIT: Duration = Duration::from_millis(20);

pub(crate) struct SeqGate {
    state: Mutex<GateState>,
    turn: Condvar,
    late_wait: Duration,
    queue_wait: Duration,
}

impl Default for SeqGate {
    fn default() -> Self {
        Self::with_waits(LATE_WAIT, QUEUE_WAIT)
    }
}

#[derive(Default)]
struct GateState {
    busy: bool,
    /// Where the last read let in ended.
    last_end: Option<u64>,
    /// How long the last read took.
    last_took: Duration,
    /// Offsets of the reads waiting, with how many wait at each.
    waiting: BTreeMap<u64, usize>,
}

/// Held while one read of the stream runs; the next waiter goes when it is dropped.
pub(crate) struct SeqTurn<'a>(&'a SeqGate, Instant);

/// A place in the queue of a read that will start at `offset`: reads above it wait until it
/// has entered (and finished) or was dropped (its blocks came from elsewhere).
pub(crate) struct Ticket<'a> {
    gate: &'a SeqGate,
    offset: u64,
    queued: bool,
}

impl SeqGate {
    pub fn with_waits(late_wait: Duration, queue_wait: Duration) -> Self {
        SeqGate {
            state: Mutex::default(),
            turn: Condvar::new(),
            late_wait,
            queue_wait,
        }
    }

    /// Queues a read that will start at `offset`.
    pub fn ticket(&self, offset: u64) -> Ticket<'_> {
        *self.state.lock().waiting.entry(offset).or_insert(0) += 1;
        Ticket {
            gate: self,
            offset,
            queued: true,
        }
    }

    /// Waits until no other read of the stream runs and none queued starts lower (and, for
    /// a read that would leave a gap, see the module documentation); the read is `len` long.
    pub fn enter(&self, offset: u64, len: u64) -> SeqTurn<'_> {
        self.ticket(offset).enter(len)
    }
}

impl GateState {
    fn unqueue(&mut self, offset: u64) {
        match self.waiting.get_mut(&offset) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.waiting.remove(&offset);
            }
        }
    }
}

impl<'a> Ticket<'a> {
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Waits for this read's turn (see [`SeqGate::enter`]).
    pub fn enter(mut self, len: u64) -> SeqTurn<'a> {
        let gate = self.gate;
        let mut s = gate.state.lock();
        let now = Instant::now();
        let deadline = now + gate.late_wait.min(s.last_took / 4);
        let queue_deadline = now + gate.queue_wait;
        loop {
            if s.busy {
                gate.turn.wait(&mut s);
                continue;
            }
            if s.waiting.keys().next() != Some(&self.offset) {
                if Instant::now() < queue_deadline {
                    gate.turn.wait_until(&mut s, queue_deadline);
                    continue;
                }
                break;
            }
            let gap = s
                .last_end
                .is_some_and(|e| self.offset > e && self.offset - e <= LATE_SPAN);
            if gap && Instant::now() < deadline {
                gate.turn.wait_until(&mut s, deadline);
                continue;
            }
            break;
        }
        s.unqueue(self.offset);
        s.busy = true;
        s.last_end = Some(self.offset + len);
        self.queued = false;
        SeqTurn(gate, Instant::now())
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.queued {
            self.gate.state.lock().unqueue(self.offset);
            self.gate.turn.notify_all();
        }
    }
}

impl Drop for SeqTurn<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.busy = false;
        s.last_took = self.1.elapsed();
        drop(s);
        self.0.turn.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn waiters_go_lowest_offset_first() {
        let gate = Arc::new(SeqGate::with_waits(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ));
        let order = Arc::new(Mutex::new(Vec::new()));
        let held = gate.enter(0, 1);
        let offsets = [5u64, 3, 9, 1, 7, 3];
        let threads: Vec<_> = offsets
            .iter()
            .map(|&off| {
                let (gate, order) = (gate.clone(), order.clone());
                std::thread::spawn(move || {
                    let _t = gate.enter(off, 1);
                    order.lock().push(off);
                })
            })
            .collect();
        // Every waiter is queued before the first one is let in.
        while gate.state.lock().waiting.values().sum::<usize>() < offsets.len() {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*order.lock(), vec![1, 3, 3, 5, 7, 9]);
    }

    #[test]
    fn a_place_nobody_takes_holds_reads_above_it_only_briefly() {
        let gate = SeqGate::with_waits(Duration::from_secs(10), Duration::from_millis(30));
        let _stuck = gate.ticket(10);
        let t0 = Instant::now();
        drop(gate.enter(20, 1));
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_ticket_holds_back_reads_above_it_until_dropped() {
        let gate = Arc::new(SeqGate::with_waits(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ));
        let ticket = gate.ticket(10);
        let (g, entered) = (
            gate.clone(),
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
        );
        let e = entered.clone();
        let t = std::thread::spawn(move || {
            let _t = g.enter(20, 1);
            e.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!entered.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(ticket.offset(), 10);
        drop(ticket);
        t.join().unwrap();
        assert!(entered.load(std::sync::atomic::Ordering::SeqCst));
        // A read below every queued one goes at once.
        let _low = gate.ticket(30);
        drop(gate.enter(5, 1));
    }

    #[test]
    fn a_read_leaving_a_gap_waits_briefly_for_the_one_that_fills_it() {
        // Long enough that the read filling the gap is surely there in time.
        let gate = Arc::new(SeqGate::with_waits(
            Duration::from_secs(10),
            Duration::from_secs(10),
        ));
        {
            // A read that took 400 ms: a gap waits up to 100 ms.
            let _t = gate.enter(0, 100);
            std::thread::sleep(Duration::from_millis(400));
        }
        let order = Arc::new(Mutex::new(Vec::new()));
        let (g, o) = (gate.clone(), order.clone());
        let ahead = std::thread::spawn(move || {
            let _t = g.enter(200, 100);
            o.lock().push(200);
        });
        std::thread::sleep(Duration::from_millis(10));
        {
            let _t = gate.enter(100, 100);
            std::thread::sleep(Duration::from_millis(400));
            order.lock().push(100);
        }
        ahead.join().unwrap();
        assert_eq!(*order.lock(), vec![100, 200]);
        // In order, or a jump further than LATE_SPAN (the reader's own): no wait.
        let t0 = Instant::now();
        drop(gate.enter(300, 100));
        drop(gate.enter(400 + LATE_SPAN + 1, 100));
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Nobody fills a gap: the read goes after the wait.
        let gate = SeqGate::with_waits(Duration::from_millis(30), Duration::from_secs(10));
        {
            let _t = gate.enter(0, 100);
            std::thread::sleep(Duration::from_millis(200));
        }
        let t0 = Instant::now();
        drop(gate.enter(1000, 100));
        assert!(t0.elapsed() >= Duration::from_millis(30));
        // After a quick read, a gap waits a quarter of it at most (here: 0).
        let gate = SeqGate::with_waits(Duration::from_secs(10), Duration::from_secs(10));
        drop(gate.enter(0, 100));
        let t0 = Instant::now();
        drop(gate.enter(1000, 100));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn one_at_a_time() {
        let gate = Arc::new(SeqGate::default());
        let inside = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let threads: Vec<_> = (0..8u64)
            .map(|i| {
                let (gate, inside) = (gate.clone(), inside.clone());
                std::thread::spawn(move || {
                    for k in 0..50 {
                        let _t = gate.enter(i * 100 + k, 1);
                        assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
