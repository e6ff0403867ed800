//! Locks, and the one rule sluice keeps about a poisoned one.
//!
//! A std lock is poisoned when a thread panicked while holding it. Every
//! lock here guards data that is whole between any two of its statements
//! (a count moved in one step, an entry inserted or removed whole, a value
//! swapped), so the data a poisoned lock holds is still right to use, and
//! going on with it is better than failing every later request that needs
//! it. So locks are taken through these functions, never with `unwrap`.
//!
//! [`Memo`] is the map of things made once on first use and shared after
//! (the Redis store's scripts); [`Latest`] keeps only the last thing made,
//! for the next caller that asks for the same (a refusal's rendered parts).
//! [`Rouse`] wakes a task that rests until it has work (the Redis store's
//! monitors and upkeeps).

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// `mutex`, locked, poisoned or not.
#[allow(clippy::disallowed_methods)] // the one place a lock is taken
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock`, for reading, poisoned or not.
#[allow(clippy::disallowed_methods)]
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `lock`, for writing, poisoned or not.
#[allow(clippy::disallowed_methods)]
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Values made on first use, one per key, and read under a shared lock
/// from then on. A value is made under the write lock, so it is made once
/// however many callers ask for it at the same moment, and exactly one of
/// them is told it made it (to load what it made, say).
pub struct Memo<K, V, S = RandomState> {
    map: RwLock<HashMap<K, V, S>>,
}

impl<K: Eq + Hash, V: Clone, S: BuildHasher + Default> Memo<K, V, S> {
    pub fn new() -> Memo<K, V, S> {
        Memo {
            map: RwLock::new(HashMap::default()),
        }
    }

    /// The value for `key`, made by `make` when there is none yet; `true`
    /// when this call made it.
    pub fn get_or_make<Q>(&self, key: &Q, make: impl FnOnce() -> V) -> (V, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(value) = read(&self.map).get(key) {
            return (value.clone(), false);
        }
        let mut map = write(&self.map);
        if let Some(value) = map.get(key) {
            return (value.clone(), false);
        }
        let value = make();
        map.insert(key.to_owned(), value.clone());
        (value, true)
    }

    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        read(&self.map).contains_key(key)
    }

    /// Every value made so far.
    pub fn values(&self) -> Vec<V> {
        read(&self.map).values().cloned().collect()
    }
}

impl<K: Eq + Hash, V: Clone, S: BuildHasher + Default> Default for Memo<K, V, S> {
    fn default() -> Memo<K, V, S> {
        Memo::new()
    }
}

/// Hashes a key that is a digest already (a policy's numbers): its bits
/// are spread as well as a hash would spread them, so they are the hash,
/// where SipHash would cost about 70 instructions a lookup. Only for
/// digests sluice made, never for what a client sends.
#[derive(Default)]
pub struct Digested(u64);

impl Hasher for Digested {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

/// A map's hasher of [`Digested`] keys.
pub type ByDigest = BuildHasherDefault<Digested>;

/// The value last made, with its key: the next caller with the same key
/// gets it again instead of making its own. A caller that finds the slot
/// busy makes its value and leaves the slot alone, so nobody ever waits
/// for it; what is kept is a saving, never something to depend on.
pub struct Latest<K, V> {
    last: Mutex<Option<(K, V)>>,
}

impl<K: PartialEq, V: Clone> Latest<K, V> {
    pub fn new() -> Latest<K, V> {
        Latest {
            last: Mutex::new(None),
        }
    }

    /// The value for `key`: the one kept when it was made for `key`,
    /// else `make()`'s, kept in its place.
    pub fn get_or_make(&self, key: K, make: impl FnOnce() -> V) -> V {
        let mut last = match self.last.try_lock() {
            Ok(last) => last,
            // Whole between any two statements, as every lock here.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return make(),
        };
        if let Some((kept, value)) = &*last {
            if *kept == key {
                return value.clone();
            }
        }
        let value = make();
        *last = Some((key, value.clone()));
        value
    }
}

impl<K: PartialEq, V: Clone> Default for Latest<K, V> {
    fn default() -> Latest<K, V> {
        Latest::new()
    }
}

impl<K, V> std::fmt::Debug for Latest<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Latest")
    }
}

/// What wakes a task that rests until it has work: the task waits on
/// [`Rouse::listener`], holding that and a `Weak` of the owner, and no
/// more. Dropping the owner rouses it too, so it finds the owner gone and
/// ends instead of waiting for good.
#[derive(Default)]
pub struct Rouse(Arc<tokio::sync::Notify>);

impl Rouse {
    /// Wakes the task; kept as a permit when it is not waiting yet.
    pub fn rouse(&self) {
        self.0.notify_one();
    }

    /// What the resting task waits on.
    pub fn listener(&self) -> Arc<tokio::sync::Notify> {
        self.0.clone()
    }
}

impl Drop for Rouse {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// Whether `wake` was notified (a permit kept for the next waiter),
/// without waiting: for the tests of the tasks that rest until told.
#[cfg(test)]
pub fn notified(wake: &tokio::sync::Notify) -> bool {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut notified = std::pin::pin!(wake.notified());
    let mut cx = Context::from_waker(Waker::noop());
    notified.as_mut().poll(&mut cx) == Poll::Ready(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_value_is_made_once_and_its_maker_is_told() {
        let memo: Memo<String, Arc<u32>> = Memo::new();
        let mut made = 0;
        let (first, new) = memo.get_or_make("a", || {
            made += 1;
            Arc::new(1)
        });
        assert!(new);
        let (again, new) = memo.get_or_make("a", || unreachable!("made twice"));
        assert!(!new);
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(made, 1);
        assert!(memo.contains("a") && !memo.contains("b"));
        assert_eq!(memo.values().len(), 1);
    }

    #[test]
    fn the_latest_value_is_given_again_for_its_key_only() {
        let latest: Latest<u64, Arc<u64>> = Latest::new();
        let first = latest.get_or_make(1, || Arc::new(10));
        let again = latest.get_or_make(1, || unreachable!("made twice for one key"));
        assert!(Arc::ptr_eq(&first, &again));
        let other = latest.get_or_make(2, || Arc::new(20));
        assert_eq!(*other, 20);
        // Only the last is kept: the first key is made again.
        let remade = latest.get_or_make(1, || Arc::new(11));
        assert_eq!(*remade, 11);
    }

    #[test]
    fn a_busy_latest_makes_without_waiting_or_keeping() {
        let latest: Latest<u64, u64> = Latest::new();
        latest.get_or_make(1, || 10);
        let held = lock(&latest.last);
        // The slot is held: the caller makes its own, and nothing changes.
        assert_eq!(latest.get_or_make(1, || 99), 99);
        assert_eq!(latest.get_or_make(2, || 20), 20);
        drop(held);
        assert_eq!(latest.get_or_make(1, || unreachable!("kept")), 10);
    }

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let mutex = Arc::new(Mutex::new(7));
        let held = mutex.clone();
        let panicked = std::thread::spawn(move || {
            let _guard = lock(&held);
            panic!("poisoning the lock on purpose");
        })
        .join();
        assert!(panicked.is_err() && mutex.is_poisoned());
        assert_eq!(*lock(&mutex), 7);
    }

    #[test]
    fn racing_makers_make_one_value() {
        let memo: Arc<Memo<u8, Arc<u8>>> = Arc::new(Memo::new());
        let makers: Vec<_> = (0..8)
            .map(|_| {
                let memo = memo.clone();
                std::thread::spawn(move || memo.get_or_make(&1, || Arc::new(1)))
            })
            .collect();
        let results: Vec<_> = makers.into_iter().map(|m| m.join().unwrap()).collect();
        assert_eq!(results.iter().filter(|(_, made)| *made).count(), 1);
        assert!(results.windows(2).all(|w| Arc::ptr_eq(&w[0].0, &w[1].0)));
    }
}
