//! The KV cache manager, by groups, in the manner of vLLM v1.
//!
//! Layers fall into KV-cache *groups* by the model's layer pattern: the full-attention
//! group and the sliding-window group. Each group has its own pool of blocks, and every
//! request has one block table per group. A layer reads and writes its keys and values
//! only through its own group's table:
//!
//! ```text
//! slot = table[pos / block_size] * block_size + pos % block_size
//! ```
//!
//! The two pools hand out block ids independently, so the same position of the same
//! request generally lives in *different* slots in the two groups; using one group's
//! slot mapping for the other group's layers is the defect this layout guards against
//! (see the tests at the bottom, and the conformance regression case).
//!
//! The sliding group returns blocks that fall wholly out of the window to its pool: after
//! a step, a request whose next query is at position `p` only needs positions
//! `p - W + 1 ..= p`, so it keeps at most `ceil(W / block_size) + 1` blocks between steps.
//! Within one prefill chunk of `n` tokens the first query still needs the `W - 1`
//! positions before it, so the peak is `ceil((W + n - 1) / block_size) + 1`.

use std::collections::HashMap;

use flint_core::math::window_start;
use flint_hal::NO_BLOCK;

/// Identifies a request inside the engine.
pub type RequestId = u64;

/// What kind of attention a group's layers do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Every position attends to all earlier positions.
    Full,
    /// A position `p` attends to `window_start(p, Some(window)) ..= p`.
    Sliding {
        /// The window `W`.
        window: usize,
    },
}

impl GroupKind {
    /// The window of a sliding group; `None` for the full group.
    pub fn window(self) -> Option<usize> {
        match self {
            GroupKind::Full => None,
            GroupKind::Sliding { window } => Some(window),
        }
    }
}

/// One KV-cache group: its kind and the layers in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroupSpec {
    /// Full or sliding.
    pub kind: GroupKind,
    /// Layer indices in this group, ascending.
    pub layers: Vec<usize>,
}

/// Derives the groups from a layer pattern (`true` = sliding layer). Groups with no
/// layers are left out; the full group comes first.
pub fn groups_from_pattern(sliding: &[bool], window: Option<usize>) -> Vec<KvGroupSpec> {
    let full: Vec<usize> = (0..sliding.len()).filter(|&i| !sliding[i]).collect();
    let swa: Vec<usize> = (0..sliding.len()).filter(|&i| sliding[i]).collect();
    let mut groups = Vec::new();
    if !full.is_empty() {
        groups.push(KvGroupSpec {
            kind: GroupKind::Full,
            layers: full,
        });
    }
    if !swa.is_empty() {
        match window {
            Some(w) if w > 0 => groups.push(KvGroupSpec {
                kind: GroupKind::Sliding { window: w },
                layers: swa,
            }),
            // A sliding layer without a window sees everything: it is a full layer.
            _ => match groups.first_mut() {
                Some(g) => {
                    g.layers.extend(swa);
                    g.layers.sort_unstable();
                }
                None => groups.push(KvGroupSpec {
                    kind: GroupKind::Full,
                    layers: swa,
                }),
            },
        }
    }
    groups
}

/// A pool of block ids `0..num_blocks`.
#[derive(Clone, Debug)]
pub struct BlockPool {
    num_blocks: usize,
    free: Vec<u32>,
}

impl BlockPool {
    /// A pool with every block free. Blocks are handed out lowest id first.
    pub fn new(num_blocks: usize) -> Self {
        let n = u32::try_from(num_blocks).unwrap_or(u32::MAX - 1);
        Self {
            num_blocks: n as usize,
            free: (0..n).rev().collect(),
        }
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Free blocks.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    fn give_back(&mut self, id: u32) {
        debug_assert!((id as usize) < self.num_blocks && !self.free.contains(&id));
        self.free.push(id);
    }
}

/// The pools ran out: the request could not be given the blocks it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBlocks {
    /// The group whose pool ran dry.
    pub group: usize,
    /// Blocks it needed.
    pub needed: usize,
    /// Blocks it had free.
    pub free: usize,
}

impl std::fmt::Display for OutOfBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KV cache group {} needs {} more blocks but has {} free",
            self.group, self.needed, self.free
        )
    }
}

impl std::error::Error for OutOfBlocks {}

#[derive(Clone, Debug)]
struct Group {
    spec: KvGroupSpec,
    pool: BlockPool,
}

/// Hands out KV blocks to requests, one block table per request per group.
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    block_size: usize,
    groups: Vec<Group>,
    /// Per request, per group: logical block index -> block id (`NO_BLOCK` once freed).
    tables: HashMap<RequestId, Vec<Vec<u32>>>,
}

impl KvCacheManager {
    /// A manager over `groups`, with `blocks_per_group[g]` blocks of `block_size` tokens
    /// in group `g`'s pool.
    ///
    /// # Panics
    /// When `block_size` is 0 or the two lists differ in length (caller bugs).
    pub fn new(groups: Vec<KvGroupSpec>, block_size: usize, blocks_per_group: &[usize]) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert_eq!(groups.len(), blocks_per_group.len());
        Self {
            block_size,
            groups: groups
                .into_iter()
                .zip(blocks_per_group)
                .map(|(spec, &n)| Group {
                    spec,
                    pool: BlockPool::new(n),
                })
                .collect(),
            tables: HashMap::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The group specs, in group order.
    pub fn group_specs(&self) -> impl Iterator<Item = &KvGroupSpec> {
        self.groups.iter().map(|g| &g.spec)
    }

    /// Number of groups.
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// The group a layer belongs to.
    pub fn group_of_layer(&self, layer: usize) -> Option<usize> {
        self.groups
            .iter()
            .position(|g| g.spec.layers.binary_search(&layer).is_ok())
    }

    /// Total blocks of group `g`.
    pub fn num_blocks(&self, g: usize) -> usize {
        self.groups[g].pool.num_blocks()
    }

    /// Free blocks of group `g`.
    pub fn num_free(&self, g: usize) -> usize {
        self.groups[g].pool.num_free()
    }

    /// True when every pool has all its blocks back.
    pub fn all_free(&self) -> bool {
        self.groups
            .iter()
            .all(|g| g.pool.num_free() == g.pool.num_blocks())
    }

    /// The block table of request `req` in group `g` (empty for an unknown request).
    pub fn block_table(&self, req: RequestId, g: usize) -> &[u32] {
        self.tables
            .get(&req)
            .and_then(|t| t.get(g))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Live (not freed) blocks of request `req` in group `g`.
    pub fn live_blocks(&self, req: RequestId, g: usize) -> usize {
        self.block_table(req, g)
            .iter()
            .filter(|&&b| b != NO_BLOCK)
            .count()
    }

    /// First position a query at `pos` needs in group `g`.
    fn first_needed(&self, g: usize, pos: usize) -> usize {
        window_start(pos, self.groups[g].spec.kind.window())
    }

    /// Blocks group `g` must newly hand out so that `req` has positions
    /// `first_query ..= last` backed (the window of `first_query` included).
    fn blocks_needed(&self, req: RequestId, g: usize, first_query: usize, last: usize) -> usize {
        let bs = self.block_size;
        let lo = self.first_needed(g, first_query) / bs;
        let hi = last / bs;
        let table = self.block_table(req, g);
        (lo..=hi)
            .filter(|&i| table.get(i).is_none_or(|&b| b == NO_BLOCK))
            .count()
    }

    /// Whether a request holding no blocks could get blocks for queries
    /// `first_query .. end` from empty pools (a prompt that fails this can never run).
    pub fn fits_when_empty(&self, first_query: usize, end: usize) -> bool {
        if end == 0 {
            return true;
        }
        let bs = self.block_size;
        (0..self.groups.len()).all(|g| {
            let lo = self.first_needed(g, first_query) / bs;
            (end - 1) / bs + 1 - lo <= self.groups[g].pool.num_blocks()
        })
    }

    /// Whether `allocate(req, first_query, end)` would succeed.
    pub fn can_allocate(&self, req: RequestId, first_query: usize, end: usize) -> bool {
        if end == 0 {
            return true;
        }
        (0..self.groups.len()).all(|g| {
            self.blocks_needed(req, g, first_query, end - 1) <= self.groups[g].pool.num_free()
        })
    }

    /// Makes sure request `req` has blocks for every position a step computing queries
    /// `first_query .. end` reads or writes, in every group. All or nothing: on failure
    /// nothing is allocated.
    pub fn allocate(
        &mut self,
        req: RequestId,
        first_query: usize,
        end: usize,
    ) -> Result<(), OutOfBlocks> {
        if end == 0 {
            return Ok(());
        }
        for g in 0..self.groups.len() {
            let needed = self.blocks_needed(req, g, first_query, end - 1);
            let free = self.groups[g].pool.num_free();
            if needed > free {
                return Err(OutOfBlocks {
                    group: g,
                    needed,
                    free,
                });
            }
        }
        let bs = self.block_size;
        let n_groups = self.groups.len();
        let tables = self
            .tables
            .entry(req)
            .or_insert_with(|| vec![Vec::new(); n_groups]);
        for (g, group) in self.groups.iter_mut().enumerate() {
            let lo = window_start(first_query, group.spec.kind.window()) / bs;
            let hi = (end - 1) / bs;
            let table = &mut tables[g];
            if table.len() <= hi {
                table.resize(hi + 1, NO_BLOCK);
            }
            for slot in &mut table[lo..=hi] {
                if *slot == NO_BLOCK {
                    // Counted above: the pool has enough.
                    *slot = group.pool.take().unwrap_or(NO_BLOCK);
                }
            }
        }
        Ok(())
    }

    /// Returns to the pools the blocks of `req` that no query at `next_pos` or later can
    /// read (sliding groups only). Call after a step with the position of the next token.
    pub fn free_out_of_window(&mut self, req: RequestId, next_pos: usize) {
        let bs = self.block_size;
        let Some(tables) = self.tables.get_mut(&req) else {
            return;
        };
        for (g, group) in self.groups.iter_mut().enumerate() {
            let GroupKind::Sliding { window } = group.spec.kind else {
                continue;
            };
            // Positions below `first` are never read again; a block is free when its
            // last position is below it.
            let first = window_start(next_pos, Some(window));
            let whole_blocks = first / bs;
            for slot in tables[g].iter_mut().take(whole_blocks) {
                if *slot != NO_BLOCK {
                    group.pool.give_back(*slot);
                    *slot = NO_BLOCK;
                }
            }
        }
    }

    /// Returns every block of `req` (finish, abort, preemption).
    pub fn free(&mut self, req: RequestId) {
        if let Some(tables) = self.tables.remove(&req) {
            for (g, table) in tables.into_iter().enumerate() {
                for b in table {
                    if b != NO_BLOCK {
                        self.groups[g].pool.give_back(b);
                    }
                }
            }
        }
    }

    /// The slots of `positions` of `req` in group `g`, through that group's own table.
    ///
    /// # Panics
    /// When a position has no block (the caller did not `allocate` it): a caller bug.
    pub fn slot_mapping(&self, req: RequestId, g: usize, positions: &[u32]) -> Vec<u32> {
        let bs = self.block_size;
        let table = self.block_table(req, g);
        positions
            .iter()
            .map(|&p| {
                let p = p as usize;
                let block = table.get(p / bs).copied().unwrap_or(NO_BLOCK);
                assert!(
                    block != NO_BLOCK,
                    "position {p} of request {req} has no block in group {g}"
                );
                (block as usize * bs + p % bs) as u32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hybrid() -> Vec<KvGroupSpec> {
        groups_from_pattern(&[true, true, false, true, false], Some(8))
    }

    #[test]
    fn groups_follow_the_pattern() {
        let g = hybrid();
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].kind, GroupKind::Full);
        assert_eq!(g[0].layers, vec![2, 4]);
        assert_eq!(g[1].kind, GroupKind::Sliding { window: 8 });
        assert_eq!(g[1].layers, vec![0, 1, 3]);
        // No window: sliding layers join the full group.
        let g = groups_from_pattern(&[true, false], None);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].layers, vec![0, 1]);
    }

    #[test]
    fn groups_map_the_same_position_to_different_slots() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[16, 16]);
        // Another request takes the first full-group blocks, so the pools diverge.
        m.allocate(7, 0, 12).unwrap();
        m.free_out_of_window(7, 12);
        m.allocate(1, 0, 6).unwrap();
        let pos: Vec<u32> = (0..6).collect();
        let full = m.slot_mapping(1, 0, &pos);
        let swa = m.slot_mapping(1, 1, &pos);
        assert_ne!(
            full, swa,
            "the two groups must hand out different blocks here"
        );
        // Each layer resolves to its own group.
        assert_eq!(m.group_of_layer(2), Some(0));
        assert_eq!(m.group_of_layer(3), Some(1));
        m.free(1);
        m.free(7);
        assert!(m.all_free());
    }

    #[test]
    fn sliding_group_keeps_at_most_window_blocks() {
        let (w, bs) = (8usize, 4usize);
        let mut m = KvCacheManager::new(hybrid(), bs, &[64, 64]);
        let bound = w.div_ceil(bs) + 1;
        // Prefill of 20 tokens in chunks of 5, then 40 decode steps.
        let mut pos = 0;
        while pos < 60 {
            let n = if pos < 20 { 5 } else { 1 };
            m.allocate(3, pos, pos + n).unwrap();
            pos += n;
            m.free_out_of_window(3, pos);
            assert!(
                m.live_blocks(3, 1) <= bound,
                "at {pos}: {}",
                m.live_blocks(3, 1)
            );
            // The full group keeps everything.
            assert_eq!(m.live_blocks(3, 0), pos.div_ceil(bs));
        }
        // The positions a query at `pos` needs are still backed.
        let needed: Vec<u32> = (window_start(pos, Some(w)) as u32..pos as u32).collect();
        let _ = m.slot_mapping(3, 1, &needed);
        m.free(3);
        assert!(m.all_free());
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[4, 100]);
        m.allocate(1, 0, 12).unwrap(); // 3 full blocks
        let err = m.allocate(2, 0, 8).unwrap_err();
        assert_eq!(err.group, 0);
        assert_eq!(err.needed, 2);
        assert_eq!(
            m.block_table(2, 1),
            &[] as &[u32],
            "nothing taken on failure"
        );
        assert_eq!(m.num_free(1), 100 - 3);
        m.free(1);
        assert!(m.all_free());
    }
}
