//! A hashed timing wheel over integer ticks: a pure data structure, with no clock and no I/O.
//!
//! # Design
//!
//! * **Slots.** The wheel has `slots` buckets (a power of two, so a tick maps to its bucket with a
//!   mask). An entry due at absolute tick `d` lives in bucket `d & mask`. Advancing from tick `c`
//!   to tick `n` only looks at the buckets of ticks `c + 1 ..= n`, or at every bucket once when the
//!   jump covers a whole rotation, so a late driver never pays O(jump).
//! * **Rounds.** Entries more than one rotation away share their bucket with nearer ones, as in
//!   the classic hashed wheel. Instead of a mutable "remaining rounds" counter that every pass
//!   would have to decrement, each entry keeps its absolute deadline, from which the remaining
//!   rounds are implied (`(d - t) >> log2(slots)` at a visit of tick `t`). A visit fires exactly
//!   the entries with `d <= now` (zero rounds left) and skips the rest untouched. Memory stays
//!   O(entries + slots), whatever the deadlines.
//! * **Overdue list.** A deadline at or before the current tick cannot go in a bucket (its bucket
//!   may already have been passed), so it goes in one extra list that every advance drains first.
//! * **Slab.** Entries live in one `Vec` with a free list of vacant cells. Each bucket is an
//!   intrusive doubly linked list threaded through the slab by index (`prev`/`next`), with head
//!   and tail kept per bucket. Cancelling is therefore O(1): the handle names the cell, the cell
//!   names its neighbours and its list, and unlinking touches at most three cells and one head.
//! * **Generations.** A cell's generation is bumped every time it is freed, and a handle carries
//!   the generation it was issued with, so a handle to a fired or cancelled entry never reaches
//!   the unrelated entry that later reuses the cell.
//! * **Order.** Every entry gets a sequence number at insertion; due entries are sorted by
//!   `(deadline, seq)` before being handed out. In the common case (a jump shorter than one
//!   rotation, nothing overdue) they are collected already in that order, and the stable sort only
//!   checks it in linear time.

use std::fmt;

/// Slab index (u32 keeps entries and handles small: a held lock has two timers).
type Idx = u32;

/// Marks the end of a list (and of the free list).
const NIL: Idx = Idx::MAX;

/// Names one scheduled entry; stays invalid forever once the entry fired or was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TimerHandle {
    index: Idx,
    generation: u32,
}

/// A live entry, linked into one list (a bucket, or the overdue list).
struct Node<T> {
    value: T,
    deadline: u64,
    seq: u64,
    /// Which list holds the node: a bucket index, or `slots` for the overdue list.
    list: Idx,
    prev: Idx,
    next: Idx,
}

enum Cell<T> {
    Live(Node<T>),
    Free { next_free: Idx },
}

struct Entry<T> {
    /// Bumped whenever the cell is freed; a handle matches only while this is unchanged.
    generation: u32,
    cell: Cell<T>,
}

#[derive(Clone, Copy)]
struct List {
    head: Idx,
    tail: Idx,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

/// A hashed timing wheel of `T`s; see the module documentation.
pub(crate) struct Wheel<T> {
    /// `slots` buckets followed by the overdue list (index `slots`).
    lists: Vec<List>,
    mask: u64,
    entries: Vec<Entry<T>>,
    free: Idx,
    current: u64,
    len: usize,
    next_seq: u64,
    /// Reused between advances: due entries as `(deadline, seq, value)` before sorting.
    scratch: Vec<(u64, u64, T)>,
}

impl<T> fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wheel")
            .field("slots", &(self.lists.len() - 1))
            .field("current_tick", &self.current)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<T> Wheel<T> {
    /// A wheel of `slots` buckets (rounded up to a power of two) at tick 0.
    ///
    /// # Panics
    /// If `slots` is 0 or has no power of two above it.
    pub(crate) fn new(slots: usize) -> Self {
        Self::with_start(slots, 0)
    }

    /// Same as [`Wheel::new`], but starting at tick `start`.
    pub(crate) fn with_start(slots: usize, start: u64) -> Self {
        assert!(slots > 0, "a timing wheel needs at least one slot");
        let slots = slots.checked_next_power_of_two().expect("too many slots");
        Wheel {
            lists: vec![EMPTY; slots + 1],
            mask: slots as u64 - 1,
            entries: Vec::new(),
            free: NIL,
            current: start,
            len: 0,
            next_seq: 0,
            scratch: Vec::new(),
        }
    }

    /// The last tick the wheel advanced to.
    pub(crate) fn current_tick(&self) -> u64 {
        self.current
    }

    /// How many entries are scheduled.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is scheduled.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slots(&self) -> usize {
        self.lists.len() - 1
    }

    /// Schedules `value` at absolute tick `deadline`. A deadline at or before the current tick is
    /// due at the next call to [`Wheel::advance`].
    pub(crate) fn insert(&mut self, deadline: u64, value: T) -> TimerHandle {
        // Invariant: every node in a bucket has `deadline > current`; anything else is overdue.
        let list = if deadline <= self.current {
            self.slots()
        } else {
            (deadline & self.mask) as usize
        };
        let list_idx = list as Idx;
        let seq = self.next_seq;
        self.next_seq += 1;
        let tail = self.lists[list].tail;
        let node = Cell::Live(Node {
            value,
            deadline,
            seq,
            list: list_idx,
            prev: tail,
            next: NIL,
        });
        let index = if self.free == NIL {
            assert!(self.entries.len() < NIL as usize, "timing wheel full");
            self.entries.push(Entry {
                generation: 0,
                cell: node,
            });
            (self.entries.len() - 1) as Idx
        } else {
            let index = self.free;
            let entry = &mut self.entries[index as usize];
            match entry.cell {
                Cell::Free { next_free } => self.free = next_free,
                Cell::Live(_) => unreachable!("free list points at a live cell"),
            }
            entry.cell = node;
            index
        };
        // Append at the tail, so a bucket stays in insertion order.
        match tail {
            NIL => self.lists[list].head = index,
            tail => self.node_mut(tail).next = index,
        }
        self.lists[list].tail = index;
        self.len += 1;
        TimerHandle {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// Cancels an entry in O(1) and returns its value, or `None` if the handle is stale (the entry
    /// already fired or was cancelled).
    pub(crate) fn cancel(&mut self, handle: TimerHandle) -> Option<T> {
        self.get(handle)?;
        Some(self.remove(handle.index).2)
    }

    /// The value of a live entry, without cancelling it.
    pub(crate) fn get(&self, handle: TimerHandle) -> Option<&T> {
        match self.entries.get(handle.index as usize) {
            Some(Entry {
                generation,
                cell: Cell::Live(node),
            }) if *generation == handle.generation => Some(&node.value),
            _ => None,
        }
    }

    /// Moves the wheel to tick `now` and appends every entry due by then to `out` as
    /// `(deadline, value)`, in deadline order and, for equal deadlines, in insertion order.
    ///
    /// A `now` before the current tick does nothing. Work is O(min(jump, slots) + entries in the
    /// visited buckets), plus sorting what is due.
    pub(crate) fn advance(&mut self, now: u64, out: &mut Vec<(u64, T)>) {
        if now < self.current {
            return;
        }
        let mut due = std::mem::take(&mut self.scratch);
        self.drain_list(self.slots(), u64::MAX, &mut due);
        let jump = now - self.current;
        if jump >= self.slots() as u64 {
            // A whole rotation or more: each bucket once; the deadline test sorts out the rounds.
            for list in 0..self.slots() {
                self.drain_list(list, now, &mut due);
            }
        } else {
            // Ticks in order, so the due entries come out already sorted.
            for k in 1..=jump {
                let list = ((self.current + k) & self.mask) as usize;
                self.drain_list(list, now, &mut due);
            }
        }
        self.current = now;
        // Keys are unique (seq is), so stability only matters for speed on presorted input.
        due.sort_by_key(|&(deadline, seq, _)| (deadline, seq));
        out.extend(due.drain(..).map(|(deadline, _, value)| (deadline, value)));
        self.scratch = due;
    }

    /// Removes from one list every node with `deadline <= limit`, keeping list order.
    fn drain_list(&mut self, list: usize, limit: u64, due: &mut Vec<(u64, u64, T)>) {
        let mut index = self.lists[list].head;
        while index != NIL {
            let node = self.node_mut(index);
            let (next, deadline) = (node.next, node.deadline);
            if deadline <= limit {
                due.push(self.remove(index));
            }
            index = next;
        }
    }

    fn node_mut(&mut self, index: Idx) -> &mut Node<T> {
        match &mut self.entries[index as usize].cell {
            Cell::Live(node) => node,
            Cell::Free { .. } => unreachable!("list links point at a free cell"),
        }
    }

    /// Unlinks a live cell from its list, frees it (bumping its generation) and returns
    /// `(deadline, seq, value)`.
    fn remove(&mut self, index: Idx) -> (u64, u64, T) {
        let entry = &mut self.entries[index as usize];
        let freed = Cell::Free {
            next_free: self.free,
        };
        let Cell::Live(node) = std::mem::replace(&mut entry.cell, freed) else {
            unreachable!("removing a free cell");
        };
        entry.generation = entry.generation.wrapping_add(1);
        self.free = index;
        self.len -= 1;
        match node.prev {
            NIL => self.lists[node.list as usize].head = node.next,
            prev => self.node_mut(prev).next = node.next,
        }
        match node.next {
            NIL => self.lists[node.list as usize].tail = node.prev,
            next => self.node_mut(next).prev = node.prev,
        }
        (node.deadline, node.seq, node.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn advance<T>(wheel: &mut Wheel<T>, now: u64) -> Vec<(u64, T)> {
        let mut out = Vec::new();
        wheel.advance(now, &mut out);
        out
    }

    #[test]
    fn fires_in_deadline_order_across_slots() {
        let mut w = Wheel::new(8);
        for d in [7, 3, 5, 1, 6] {
            w.insert(d, d);
        }
        assert_eq!(advance(&mut w, 4), vec![(1, 1), (3, 3)]);
        assert_eq!(advance(&mut w, 7), vec![(5, 5), (6, 6), (7, 7)]);
        assert!(w.is_empty());
    }

    #[test]
    fn one_slot_orders_by_deadline_then_insertion() {
        // 2, 10 and 18 share bucket 2 of an 8-slot wheel.
        let mut w = Wheel::new(8);
        w.insert(18, "c");
        w.insert(10, "b1");
        w.insert(2, "a");
        w.insert(10, "b2");
        w.insert(10, "b3");
        assert_eq!(advance(&mut w, 2), vec![(2, "a")]);
        assert_eq!(advance(&mut w, 9), vec![]);
        assert_eq!(
            advance(&mut w, 10),
            vec![(10, "b1"), (10, "b2"), (10, "b3")]
        );
        assert_eq!(advance(&mut w, 100), vec![(18, "c")]);
    }

    #[test]
    fn cancel_live_twice_after_firing_and_stale() {
        let mut w = Wheel::new(4);
        let a = w.insert(3, 'a');
        let b = w.insert(3, 'b');
        let c = w.insert(3, 'c');
        assert_eq!(w.get(b), Some(&'b'));
        assert_eq!(w.cancel(b), Some('b'));
        assert_eq!(w.cancel(b), None);
        assert_eq!(w.get(b), None);
        assert_eq!(w.len(), 2);
        assert_eq!(advance(&mut w, 3), vec![(3, 'a'), (3, 'c')]);
        assert_eq!(w.cancel(a), None);
        assert_eq!(w.cancel(c), None);
        // The freed cell is reused; the old handle must not touch the new entry.
        let d = w.insert(5, 'd');
        assert!(d.index == a.index || d.index == c.index);
        assert_eq!(w.cancel(a), None);
        assert_eq!(w.cancel(c), None);
        assert_eq!(w.get(d), Some(&'d'));
        assert_eq!(w.cancel(d), Some('d'));
        assert!(w.is_empty());
    }

    #[test]
    fn far_deadlines_fire_at_their_tick_not_a_rotation_early() {
        let mut w = Wheel::new(16);
        w.insert(5 + 16 * 3, "far");
        w.insert(5, "near");
        for now in 1..=(5 + 16 * 3) {
            let out = advance(&mut w, now);
            match now {
                5 => assert_eq!(out, vec![(5, "near")]),
                53 => assert_eq!(out, vec![(53, "far")]),
                _ => assert!(out.is_empty(), "fired at {now}: {out:?}"),
            }
        }
        assert!(w.is_empty());
    }

    #[test]
    fn ten_thousand_entries_in_one_slot() {
        let mut w = Wheel::new(crate::config::DEFAULT_TIMER_SLOTS);
        let handles: Vec<_> = (0..10_000u64)
            .map(|i| w.insert(7 + 1024 * (i % 3), i))
            .collect();
        for h in handles.iter().step_by(2) {
            assert!(w.cancel(*h).is_some());
        }
        assert_eq!(w.len(), 5_000);
        let out = advance(&mut w, 7);
        let want: Vec<_> = (1..10_000u64)
            .step_by(2)
            .filter(|i| i % 3 == 0)
            .map(|i| (7, i))
            .collect();
        assert_eq!(out, want);
        assert_eq!(w.len(), 5_000 - want.len());
    }

    #[test]
    fn jump_of_five_rotations_delivers_in_order_and_keeps_later() {
        let mut w = Wheel::new(8);
        let deadlines = [39, 1, 40, 17, 8, 9, 41, 100, 24, 2];
        for (i, d) in deadlines.into_iter().enumerate() {
            w.insert(d, i);
        }
        let out = advance(&mut w, 40);
        let got: Vec<u64> = out.iter().map(|&(d, _)| d).collect();
        assert_eq!(got, vec![1, 2, 8, 9, 17, 24, 39, 40]);
        assert_eq!(w.current_tick(), 40);
        assert_eq!(w.len(), 2);
        assert_eq!(advance(&mut w, 99), vec![(41, 6)]);
        assert_eq!(advance(&mut w, 100), vec![(100, 7)]);
    }

    #[test]
    fn past_deadlines_fire_at_next_advance_in_order() {
        let mut w = Wheel::with_start(8, 50);
        w.insert(52, "future");
        w.insert(50, "now");
        w.insert(10, "past");
        w.insert(10, "past2");
        assert_eq!(advance(&mut w, 49), vec![], "going back is a no-op");
        assert_eq!(
            advance(&mut w, 50),
            vec![(10, "past"), (10, "past2"), (50, "now")]
        );
        assert_eq!(advance(&mut w, 52), vec![(52, "future")]);
    }

    #[test]
    fn insert_after_advance_uses_the_new_tick() {
        let mut w = Wheel::new(4);
        w.insert(2, 0);
        assert_eq!(advance(&mut w, 3), vec![(2, 0)]);
        w.insert(3, 1); // == current: overdue
        w.insert(4, 2); // bucket 0, passed long ago at tick 0
        w.insert(7, 3); // bucket 3, the bucket just visited
        assert_eq!(w.len(), 3);
        assert_eq!(advance(&mut w, 4), vec![(3, 1), (4, 2)]);
        assert_eq!(advance(&mut w, 6), vec![]);
        assert_eq!(advance(&mut w, 7), vec![(7, 3)]);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn large_start_and_flush_to_max() {
        let start = u64::MAX - 10;
        let mut w = Wheel::with_start(crate::config::DEFAULT_TIMER_SLOTS, start);
        assert_eq!(w.current_tick(), start);
        w.insert(u64::MAX, 'z');
        w.insert(start + 3, 'b');
        w.insert(start + 1, 'a');
        assert_eq!(advance(&mut w, start + 2), vec![(start + 1, 'a')]);
        assert_eq!(
            advance(&mut w, u64::MAX),
            vec![(start + 3, 'b'), (u64::MAX, 'z')]
        );
        w.insert(u64::MAX, 'm');
        assert_eq!(advance(&mut w, u64::MAX), vec![(u64::MAX, 'm')]);
    }

    #[test]
    fn odd_slot_counts_round_up() {
        let w: Wheel<()> = Wheel::new(1000);
        assert_eq!(w.slots(), 1024);
        let mut w = Wheel::new(1);
        w.insert(3, 3);
        w.insert(1, 1);
        assert_eq!(advance(&mut w, 2), vec![(1, 1)]);
        assert_eq!(advance(&mut w, 3), vec![(3, 3)]);
    }

    /// A tiny deterministic xorshift64 generator.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn matches_a_btreemap_model() {
        for seed in 1..=20u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let start = rng.below(1_000);
            let mut w = Wheel::with_start(1 << rng.below(5), start);
            // (deadline, insertion number) -> handle; iteration order is the firing order.
            let mut model = BTreeMap::new();
            let mut now = start;
            for id in 0..2_000u64 {
                match rng.below(10) {
                    0..=5 => {
                        let deadline = (now + rng.below(80)).saturating_sub(5);
                        let h = w.insert(deadline, id);
                        model.insert((deadline, id), h);
                    }
                    6 | 7 if !model.is_empty() => {
                        let skip = rng.below(model.len() as u64) as usize;
                        let key = *model.keys().nth(skip).unwrap();
                        let h = model.remove(&key).unwrap();
                        assert_eq!(w.get(h), Some(&key.1));
                        assert_eq!(w.cancel(h), Some(key.1));
                        assert_eq!(w.cancel(h), None);
                    }
                    _ => {
                        now += if rng.below(8) == 0 {
                            rng.below(200)
                        } else {
                            rng.below(3)
                        };
                        let got = advance(&mut w, now);
                        let later = model.split_off(&(now + 1, 0));
                        let want: Vec<_> = model.keys().map(|&(d, id)| (d, id)).collect();
                        for h in model.values() {
                            assert_eq!(w.get(*h), None, "fired handle still live");
                        }
                        model = later;
                        assert_eq!(got, want, "seed {seed} at tick {now}");
                    }
                }
                assert_eq!(w.len(), model.len());
            }
        }
    }
}
