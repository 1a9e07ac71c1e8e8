//! [`OffsetMap`]: values by offset, the store of the pure core's per-offset facts.

use std::collections::VecDeque;

/// Values by offset, for offsets that arrive in increasing order and leave in any: a deque
/// in offset order whose removed entries stay as holes until the front passes them, or until
/// holes outnumber values, when it is compacted. While offsets arrive one after another
/// (a partition's usual case), each sits at its distance from the front, so a lookup is one
/// index; after a gap in the offsets or a compaction it is a binary search of the deque. The
/// dispatcher's records and the queue's bodies are kept this way: a tree's lookups were most
/// of a delivery's cost.
#[derive(Debug)]
pub struct OffsetMap<T> {
    /// In offset order; the front is never a hole.
    entries: VecDeque<(i64, Option<T>)>,
    len: usize,
}

impl<T> Default for OffsetMap<T> {
    fn default() -> Self {
        OffsetMap {
            entries: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> OffsetMap<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where `offset` sits in `entries`, hole or not.
    fn index(&self, offset: i64) -> Result<usize, usize> {
        let Some(&(first, _)) = self.entries.front() else {
            return Err(0);
        };
        if offset < first {
            return Err(0);
        }
        // Offsets rise by at least one per entry: `offset` sits at its distance from the
        // front (the usual case), or before it by the offsets missing below it.
        let last = self.entries.len() - 1;
        let mut high = usize::try_from(offset - first).map_or(last, |d| d.min(last));
        match self.entries[high].0.cmp(&offset) {
            std::cmp::Ordering::Equal => return Ok(high),
            std::cmp::Ordering::Less => return Err(high + 1),
            std::cmp::Ordering::Greater => {}
        }
        // Steps back, doubling, until below it; then a binary search between.
        let mut low = 0;
        let mut step = 1;
        while step <= high {
            let at = high - step;
            if self.entries[at].0 <= offset {
                low = at;
                break;
            }
            high = at;
            step *= 2;
        }
        while low < high {
            let mid = low + (high - low) / 2;
            match self.entries[mid].0.cmp(&offset) {
                std::cmp::Ordering::Equal => return Ok(mid),
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
            }
        }
        Err(low)
    }

    pub fn contains_key(&self, offset: i64) -> bool {
        self.get(offset).is_some()
    }

    pub fn get(&self, offset: i64) -> Option<&T> {
        let at = self.index(offset).ok()?;
        self.entries[at].1.as_ref()
    }

    pub fn get_mut(&mut self, offset: i64) -> Option<&mut T> {
        let at = self.index(offset).ok()?;
        self.entries[at].1.as_mut()
    }

    /// Puts `value` at `offset`; false (and nothing changes) if it holds one there already.
    pub fn insert(&mut self, offset: i64, value: T) -> bool {
        if self.entries.back().is_none_or(|&(last, _)| last < offset) {
            self.entries.push_back((offset, Some(value)));
            self.len += 1;
            return true;
        }
        match self.index(offset) {
            Ok(at) if self.entries[at].1.is_some() => return false,
            Ok(at) => self.entries[at].1 = Some(value),
            Err(at) => self.entries.insert(at, (offset, Some(value))),
        }
        self.len += 1;
        true
    }

    pub fn remove(&mut self, offset: i64) -> Option<T> {
        let at = self.index(offset).ok()?;
        let value = self.entries[at].1.take()?;
        self.len -= 1;
        while self.entries.front().is_some_and(|(_, v)| v.is_none()) {
            self.entries.pop_front();
        }
        if self.entries.len() > 2 * self.len + 64 {
            self.entries.retain(|(_, v)| v.is_some());
        }
        Some(value)
    }

    /// The lowest offset held, and its value.
    pub fn first(&self) -> Option<(i64, &T)> {
        let (offset, value) = self.entries.front()?;
        Some((*offset, value.as_ref()?))
    }

    /// The values, in offset order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|(_, v)| v.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// The offset map holds what a tree would, whatever the order of removals, the gaps
        /// between offsets, an offset put back or offered out of order.
        #[test]
        fn the_offset_map_is_a_map(
            ops in proptest::collection::vec((0_u8..10, 0_i64..40), 0..600),
        ) {
            let mut map = OffsetMap::new();
            let mut tree = BTreeMap::new();
            let mut next = 0_i64;
            for (op, n) in ops {
                match op {
                    // Mostly the next offset, sometimes past a gap.
                    0..=3 => {
                        next += if n < 30 { 1 } else { n * 1_000 };
                        let fresh = tree.insert(next, next * 3).is_none();
                        prop_assert_eq!(map.insert(next, next * 3), fresh);
                    }
                    // An offset already seen, or below the lowest held.
                    4 => {
                        let offset = next - n;
                        let fresh = !tree.contains_key(&offset);
                        prop_assert_eq!(map.insert(offset, offset * 3), fresh);
                        tree.entry(offset).or_insert(offset * 3);
                    }
                    // A removal near the top, or of the lowest.
                    5..=8 => {
                        let offset = if op == 8 {
                            tree.keys().next().copied().unwrap_or(0)
                        } else {
                            next - n
                        };
                        prop_assert_eq!(map.remove(offset), tree.remove(&offset));
                    }
                    _ => {
                        let offset = next - n;
                        prop_assert_eq!(map.get(offset), tree.get(&offset));
                    }
                }
                prop_assert_eq!(map.len(), tree.len());
                prop_assert_eq!(map.first(), tree.iter().next().map(|(&o, v)| (o, v)));
                prop_assert!(
                    map.entries.len() <= 2 * map.len() + 64
                        || map.entries.front().is_some_and(|e| e.1.is_some())
                );
            }
            prop_assert_eq!(map.values().collect::<Vec<_>>(), tree.values().collect::<Vec<_>>());
            for offset in 0..=next {
                prop_assert_eq!(map.get(offset), tree.get(&offset));
            }
        }
    }
}
