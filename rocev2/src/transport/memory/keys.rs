//! The key pool (rxe_pool.c): one index space for MRs and MWs, keys
//! `index << 8 | key_byte`, random key bytes, free indices reused first in,
//! first out.

use std::collections::VecDeque;

use super::object::Object;
use super::region::Region;
use super::RegError;

/// Largest usable index: keys carry 24 index bits.
pub(super) const MAX_INDEX: u32 = (1 << 24) - 1;

#[derive(Debug)]
pub(super) struct Slot {
    pub(super) key: u8,
    pub(super) obj: Option<Object>,
}

#[derive(Debug)]
pub(super) struct Table {
    /// `slots[0]` is never used.
    pub(super) slots: Vec<Slot>,
    pub(super) free: VecDeque<u32>,
    pub(super) max_index: u32,
    /// State of the key byte generator (splitmix64).
    pub(super) rng: u64,
}

pub(super) fn key_of(index: u32, key: u8) -> u32 {
    (index << 8) | u32::from(key)
}

impl Table {
    /// An empty pool of `max_index` indices whose key bytes follow `seed`.
    pub(super) fn new(max_index: u32, seed: u64) -> Table {
        Table { slots: vec![Slot { key: 0, obj: None }], free: VecDeque::new(), max_index, rng: seed }
    }

    /// A random key byte other than `last` (rxe `rxe_get_next_key`: a slot
    /// never gets the same key byte twice in a row, so the previous key of a
    /// reused or re-registered slot always fails).
    pub(super) fn next_key_byte(&mut self, last: u8) -> u8 {
        loop {
            // splitmix64 (Steele, Lea, Flood 2014).
            self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let b = (z ^ (z >> 31)) as u8;
            if b != last {
                return b;
            }
        }
    }

    /// The object whose current key is `key`.
    pub(super) fn get(&self, key: u32) -> Option<&Object> {
        let slot = self.slots.get((key >> 8) as usize)?;
        if key >> 8 == 0 || slot.key != key as u8 {
            return None;
        }
        slot.obj.as_ref()
    }

    pub(super) fn get_mut(&mut self, key: u32) -> Option<&mut Object> {
        let slot = self.slots.get_mut((key >> 8) as usize)?;
        if key >> 8 == 0 || slot.key != key as u8 {
            return None;
        }
        slot.obj.as_mut()
    }

    pub(super) fn region_at(&mut self, index: u32) -> Option<&mut Region> {
        match self.slots.get_mut(index as usize)?.obj.as_mut()? {
            Object::Mr(r) => Some(r),
            Object::Mw(_) => None,
        }
    }

    /// Put `obj` into a fresh slot; returns its key.
    pub(super) fn insert(&mut self, obj: Object) -> Result<u32, RegError> {
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let next = self.slots.len() as u32;
                if next > self.max_index {
                    return Err(RegError::NoResources);
                }
                self.slots.push(Slot { key: 0, obj: None });
                next
            }
        };
        let key = self.next_key_byte(self.slots[index as usize].key);
        let slot = &mut self.slots[index as usize];
        slot.key = key;
        slot.obj = Some(obj);
        Ok(key_of(index, key))
    }

    /// Put `obj` into the slot `key >> 8` with key byte `key as u8` (see
    /// [`MemoryTable::register_with_key`]); the slot must be free.
    pub(super) fn insert_at(&mut self, key: u32, obj: Object) -> Result<u32, RegError> {
        let index = key >> 8;
        if index == 0 {
            return Err(RegError::InvalidArgument);
        }
        if index > self.max_index {
            return Err(RegError::NoResources);
        }
        while self.slots.len() as u32 <= index {
            let next = self.slots.len() as u32;
            self.slots.push(Slot { key: 0, obj: None });
            if next != index {
                self.free.push_back(next);
            }
        }
        if self.slots[index as usize].obj.is_some() {
            return Err(RegError::InvalidArgument);
        }
        self.free.retain(|&i| i != index);
        let slot = &mut self.slots[index as usize];
        slot.key = key as u8;
        slot.obj = Some(obj);
        Ok(key)
    }

    pub(super) fn remove(&mut self, index: u32) {
        if let Some(slot) = self.slots.get_mut(index as usize) {
            if slot.obj.take().is_some() {
                self.free.push_back(index);
            }
        }
    }
}
