//! Single-flight: concurrent misses on one key wait for one fetch instead of each going to the
//! slow store.

use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;
use std::hash::Hash;
use std::sync::Arc;

struct Flight<V> {
    result: Mutex<Option<V>>,
    done: Condvar,
}

/// What [`SingleFlight::claim`] gives: lead the fetch, or wait for the one in progress.
pub enum Claim<'a, K: Hash + Eq + Clone, V: Clone> {
    Leader(FlightGuard<'a, K, V>),
    Follower(Waiter<V>),
}

pub struct Waiter<V> {
    flight: Arc<Flight<V>>,
}

impl<V: Clone> Waiter<V> {
    pub fn wait(self) -> V {
        let mut r = self.flight.result.lock();
        while r.is_none() {
            self.flight.done.wait(&mut r);
        }
        r.clone().expect("set before notify")
    }
}

/// The leader's duty: call [`FlightGuard::complete`]. If the leader drops the guard without
/// completing (an error path, a panic), waiters get `abandoned`, so nobody waits forever.
pub struct FlightGuard<'a, K: Hash + Eq + Clone, V: Clone> {
    table: &'a SingleFlight<K, V>,
    key: K,
    flight: Arc<Flight<V>>,
    abandoned: Option<V>,
}

impl<K: Hash + Eq + Clone, V: Clone> FlightGuard<'_, K, V> {
    pub fn key(&self) -> &K {
        &self.key
    }
    pub fn complete(mut self, value: V) {
        self.finish(value);
    }
    fn finish(&mut self, value: V) {
        self.table.shard(&self.key).lock().remove(&self.key);
        *self.flight.result.lock() = Some(value);
        self.flight.done.notify_all();
        self.abandoned = None;
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Drop for FlightGuard<'_, K, V> {
    fn drop(&mut self) {
        if let Some(v) = self.abandoned.take() {
            self.finish(v);
        }
    }
}

const SHARDS: usize = 32;

type Shard<K, V> = Mutex<FxHashMap<K, Arc<Flight<V>>>>;

pub struct SingleFlight<K, V> {
    shards: Box<[Shard<K, V>]>,
    abandoned: V,
}

impl<K: Hash + Eq + Clone, V: Clone> SingleFlight<K, V> {
    /// `abandoned` is what waiters receive if a leader gives up without a result.
    pub fn new(abandoned: V) -> Self {
        SingleFlight {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
            abandoned,
        }
    }

    fn shard(&self, key: &K) -> &Shard<K, V> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(key);
        &self.shards[(h as usize >> 7) % SHARDS]
    }

    pub fn claim(&self, key: K) -> Claim<'_, K, V> {
        let mut map = self.shard(&key).lock();
        if let Some(f) = map.get(&key) {
            return Claim::Follower(Waiter { flight: f.clone() });
        }
        let flight = Arc::new(Flight {
            result: Mutex::new(None),
            done: Condvar::new(),
        });
        map.insert(key.clone(), flight.clone());
        Claim::Leader(FlightGuard {
            table: self,
            key,
            flight,
            abandoned: Some(self.abandoned.clone()),
        })
    }

    pub fn in_flight(&self, key: &K) -> bool {
        self.shard(key).lock().contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn many_waiters_one_fetch() {
        let sf: SingleFlight<u64, Result<u64, i32>> = SingleFlight::new(Err(5));
        let fetches = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| match sf.claim(7) {
                    Claim::Leader(g) => {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        g.complete(Ok(42));
                    }
                    Claim::Follower(w) => assert_eq!(w.wait(), Ok(42)),
                });
            }
        });
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        assert!(!sf.in_flight(&7));
    }

    #[test]
    fn abandoned_flight_releases_waiters() {
        let sf: SingleFlight<u64, Result<u64, i32>> = SingleFlight::new(Err(5));
        let Claim::Leader(g) = sf.claim(1) else {
            panic!("first claim leads")
        };
        let Claim::Follower(w) = sf.claim(1) else {
            panic!("second claim follows")
        };
        drop(g);
        assert_eq!(w.wait(), Err(5));
    }
}
