//! The writer thread's loop: each message handled in turn (an entry or a tombstone packed, a
//! flush, a checkpoint, space given back, the shutdown), and the timers between them (a
//! partial cluster written once it waited `flush_interval`, a checkpoint every
//! `checkpoint_interval`, admission resumed once space came back).

use super::checkpoint::{self, Pos};
use super::stats::inc;
use super::writer::{Kind, Msg, Writer};
use super::SsdError;
use crossbeam_channel::RecvTimeoutError;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

impl Writer {
    pub fn run(mut self) {
        loop {
            self.drain_reinserts();
            let timeout = self
                .next_deadline()
                .saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(timeout) {
                Ok(msg) => {
                    if self.handle(msg) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.finish();
                    return;
                }
            }
            self.tick();
        }
    }

    /// Handles one message; true when the writer must stop.
    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Put {
                key,
                version,
                data,
                charge,
                budgeted,
            } => {
                self.sh.queued_bytes.fetch_sub(data.len() as u64, Relaxed);
                self.add(key, version, &data, (charge, budgeted), Kind::Put);
            }
            Msg::Remove(key) => self.add(key, 0, &[], (0, true), Kind::Tombstone),
            Msg::Flush(done) => {
                self.drain_all();
                let _ = done.send(());
            }
            Msg::Checkpoint(done) => {
                self.drain_all();
                let _ = done.send(self.checkpoint());
            }
            Msg::Yield(bytes, done) => {
                let _ = done.send(self.give_back(bytes));
            }
            Msg::Shutdown(done) => {
                let durable = self.finish();
                let _ = done.send(durable);
                return true;
            }
        }
        false
    }

    /// Whether the index on disk (checkpoint and log) is the one in memory.
    fn finish(&mut self) -> bool {
        self.drain_all();
        if !self.changed {
            return true;
        }
        match self.checkpoint() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("SSD cache: checkpoint at shutdown failed: {e}");
                false
            }
        }
    }

    fn next_deadline(&self) -> Instant {
        let cfg = &self.sh.cfg;
        let mut d = self.last_cp + cfg.checkpoint_interval;
        if let Some(t) = self.opened {
            d = d.min(t + cfg.flush_interval);
        }
        if self.sh.full.load(Relaxed) {
            d = d.min(self.last_full_check + cfg.flush_interval);
        }
        d.max(Instant::now() + Duration::from_millis(1))
    }

    /// Time-driven work: write a partial cluster that waited long enough, checkpoint, see
    /// whether space came back after the device filled up.
    fn tick(&mut self) {
        let sh = self.sh.clone();
        let cfg = &sh.cfg;
        if self
            .opened
            .is_some_and(|t| t.elapsed() >= cfg.flush_interval)
        {
            self.seal();
        }
        if self.last_cp.elapsed() >= cfg.checkpoint_interval {
            if self.changed {
                if let Err(e) = self.checkpoint() {
                    tracing::warn!("SSD cache: checkpoint failed: {e}");
                }
            }
            self.last_cp = Instant::now();
        }
        if self.sh.full.load(Relaxed) && self.last_full_check.elapsed() >= cfg.flush_interval {
            self.last_full_check = Instant::now();
            if self.space_ok() {
                self.sh.full.store(false, Relaxed);
                tracing::info!("SSD cache: space available again; admitting");
            }
        }
    }

    /// Writes everything pending, including rewrites that reclaim queues meanwhile.
    fn drain_all(&mut self) {
        loop {
            self.drain_reinserts();
            self.seal();
            if self.reinserts.is_empty() {
                return;
            }
        }
    }

    fn drain_reinserts(&mut self) {
        while let Some((key, loc)) = self.reinserts.pop_front() {
            self.reinsert(key, loc);
        }
    }

    /// Makes the written segments durable, then snapshots the index with the position it
    /// covers (the end of the last written cluster).
    fn checkpoint(&mut self) -> Result<(), SsdError> {
        for s in &self.dirty {
            s.file
                .sync_data()
                .map_err(super::error::io_err("fsync", &s.path))?;
        }
        self.dirty.clear();
        let pos = match &self.cur {
            Some(s) => Pos {
                seq: s.seq,
                off: self.cur_off,
            },
            None => Pos {
                seq: self.next_seq,
                off: 0,
            },
        };
        let sh = &self.sh;
        checkpoint::write(&sh.dir, &sh.uuid, sh.seed, pos, &sh.index)?;
        inc(&sh.ctr.checkpoints);
        self.last_cp = Instant::now();
        self.changed = false;
        Ok(())
    }
}
