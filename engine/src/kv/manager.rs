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
//!
//! **Prefix caching.** Once a block is full and its keys and values are written, it is
//! identified by a [`BlockHash`] chained over the tokens of every block up to it (and a
//! slot for anything else that would change its contents), and its group's pool can find
//! it by that hash. Blocks carry reference counts: requests with a common prefix share
//! its blocks. A block no request holds is free; a free block with a hash stays findable
//! until its pool needs blocks and evicts it, least recently freed first (a request's
//! blocks are freed last to first, so a prefix loses its tail before its head). A new
//! request starts after the longest prefix every group can supply
//! ([`KvCacheManager::find_cached_prefix`]): a full-attention group needs every block
//! of it, a sliding group only those its window still sees from the first token after
//! it (the earlier entries of its table are `NO_BLOCK`, as when blocks leave the window).
//!
//! **Recurrent state.** Linear-attention layers (Qwen 3.5's Gated DeltaNet) keep no
//! per-position keys and values but one fixed-size state per sequence (their convolution
//! window and delta-rule state). Their group is [`GroupKind::Recurrent`]: a block of it is
//! one sequence's state slot, so a request holds exactly one block there from its first
//! step to its end, however long it grows (its table is `[slot]`). The forward starts the
//! state from zero at a sequence's position 0 and carries it across chunks; a preempted
//! request frees its slot with its other blocks and recomputes from its first token like
//! them. The state after a prefix is not kept per block, so a model with a recurrent
//! group runs with prefix caching off ([`KvCacheManager::supports_prefix_caching`]).
//!
//! **Cache events.** With [`KvCacheManager::set_event_log`] on, the first group's pool
//! records what enters and leaves its prefix cache as [`KvCacheEvent`]s (blocks stored,
//! blocks evicted, everything cleared), in order, for a router that wants to know which
//! prefixes this engine holds (`flint serve --kv-events`); [`KvCacheManager::take_events`]
//! drains them. Off (the default), nothing is recorded and the hooks cost one branch.

use std::collections::{BTreeMap, HashMap};

use flint_core::math::window_start;
use flint_hal::NO_BLOCK;
use sha2::{Digest, Sha256};

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
    /// One fixed-size state per sequence (linear attention): a block is a state slot,
    /// one per request whatever its length.
    Recurrent,
}

impl GroupKind {
    /// The window of a sliding group; `None` for the full and recurrent groups.
    pub fn window(self) -> Option<usize> {
        match self {
            GroupKind::Full | GroupKind::Recurrent => None,
            GroupKind::Sliding { window } => Some(window),
        }
    }
}

/// What a layer keeps between steps, the key of its KV-cache group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerCache {
    /// Keys and values of every position (full attention).
    Full,
    /// Keys and values of the window's positions (sliding-window attention).
    Sliding,
    /// One fixed-size state per sequence (linear attention).
    Recurrent,
}

/// One KV-cache group: its kind and the layers in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvGroupSpec {
    /// Full or sliding.
    pub kind: GroupKind,
    /// Layer indices in this group, ascending.
    pub layers: Vec<usize>,
}

/// Derives the groups from a layer pattern (`true` = sliding layer), as
/// [`groups_from_layers`].
pub fn groups_from_pattern(sliding: &[bool], window: Option<usize>) -> Vec<KvGroupSpec> {
    let layers: Vec<LayerCache> = sliding
        .iter()
        .map(|&s| {
            if s {
                LayerCache::Sliding
            } else {
                LayerCache::Full
            }
        })
        .collect();
    groups_from_layers(&layers, window)
}

/// Derives the groups from what each layer keeps. Groups with no layers are left out;
/// the full group comes first, then the sliding one, then the recurrent one. A sliding
/// layer without a window sees everything: it joins the full group.
pub fn groups_from_layers(layers: &[LayerCache], window: Option<usize>) -> Vec<KvGroupSpec> {
    let of = |kind: LayerCache| -> Vec<usize> {
        (0..layers.len()).filter(|&i| layers[i] == kind).collect()
    };
    let (full, swa, recurrent) = (
        of(LayerCache::Full),
        of(LayerCache::Sliding),
        of(LayerCache::Recurrent),
    );
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
    if !recurrent.is_empty() {
        groups.push(KvGroupSpec {
            kind: GroupKind::Recurrent,
            layers: recurrent,
        });
    }
    groups
}

/// The identity of a full KV block's contents: SHA-256 over the parent block's hash,
/// the block's token ids and the request's extra keys ([`hash_block`]).
///
/// SHA-256 rather than a fast 64-bit hash: clients choose the tokens, and a hash a
/// client could collide on purpose would let it be served another prompt's keys and
/// values. Hashing costs one short input per block (microseconds for a long prompt),
/// next to milliseconds of forward per block.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash([u8; 32]);

impl std::fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

impl BlockHash {
    /// The 32 bytes of the SHA-256 digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest's last 8 bytes as a big-endian integer: the form vLLM's KV events
    /// give a block hash in (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, its default).
    pub fn to_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[24..]);
        u64::from_be_bytes(b)
    }
}

/// A change to the prefix cache of the first KV-cache group, as
/// [`KvCacheManager::take_events`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Consecutive blocks of one sequence became findable: block `i` holds
    /// `tokens[i * block_size..(i + 1) * block_size]` and has hash `hashes[i]`; the
    /// first comes after the block whose hash is `parent` (`None`: it starts the
    /// sequence).
    Stored {
        /// The blocks' chained hashes, in sequence order.
        hashes: Vec<BlockHash>,
        /// The hash of the block before the first (`None` at the sequence's start).
        parent: Option<BlockHash>,
        /// The blocks' tokens, `hashes.len() * block_size` of them.
        tokens: Vec<u32>,
    },
    /// These blocks left the cache (handed out again for other contents).
    Removed {
        /// Their hashes.
        hashes: Vec<BlockHash>,
    },
    /// Every block left the cache.
    AllCleared,
}

/// The hash of a block holding `tokens`, after the block whose hash is `parent` (`None`
/// for a sequence's first block). `extra` holds whatever else changes the block's keys
/// and values (an adapter, an image's hash); every request passes nothing today.
pub fn hash_block(parent: Option<&BlockHash>, tokens: &[u32], extra: &[u8]) -> BlockHash {
    let mut h = Sha256::new();
    match parent {
        Some(p) => {
            h.update([1u8]);
            h.update(p.0);
        }
        None => h.update([0u8]),
    }
    h.update((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.update((extra.len() as u64).to_le_bytes());
    h.update(extra);
    BlockHash(h.finalize().into())
}

/// The chained hashes of the first `n` full blocks of `tokens`, after `hashes` (the
/// hashes of the blocks before them, extended in place).
fn extend_hashes(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize, n: usize) {
    while hashes.len() < n {
        let i = hashes.len();
        let Some(block) = tokens.get(i * block_size..(i + 1) * block_size) else {
            return;
        };
        let h = hash_block(hashes.last(), block, &[]);
        hashes.push(h);
    }
}

/// A pool of block ids `0..num_blocks`, with reference counts and the prefix cache.
///
/// A block is *free* when no request holds it. A free block without a hash is handed
/// out first; a free block with a hash (a *cached* block) stays findable by its hash
/// until the pool runs out of the others and evicts it, least recently freed first.
#[derive(Clone, Debug)]
pub struct BlockPool {
    num_blocks: usize,
    /// Free blocks without a hash (handed out from the end).
    free: Vec<u32>,
    /// Free blocks with a hash, by the tick at which they were freed.
    evictable: BTreeMap<u64, u32>,
    /// The last tick handed out.
    tick: u64,
    /// Per block: how many requests hold it.
    refs: Vec<u32>,
    /// Per block: its hash while it is cached.
    hash: Vec<Option<BlockHash>>,
    /// Per block: the tick at which it was freed (its key in `evictable`).
    freed_at: Vec<u64>,
    /// The cached blocks by hash.
    cached: HashMap<BlockHash, u32>,
    /// Cached blocks handed out again (their contents forgotten) so far.
    evictions: u64,
    /// What entered and left the cache since the last drain; `None`: not recorded.
    events: Option<Vec<KvCacheEvent>>,
}

impl BlockPool {
    /// A pool with every block free. Blocks are handed out lowest id first.
    pub fn new(num_blocks: usize) -> Self {
        let n = u32::try_from(num_blocks).unwrap_or(u32::MAX - 1);
        Self {
            num_blocks: n as usize,
            free: (0..n).rev().collect(),
            evictable: BTreeMap::new(),
            tick: 0,
            refs: vec![0; n as usize],
            hash: vec![None; n as usize],
            freed_at: vec![0; n as usize],
            cached: HashMap::new(),
            evictions: 0,
            events: None,
        }
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Free blocks (cached ones included: they are handed out when needed).
    pub fn num_free(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks findable by hash (held or free).
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// The cached block with hash `h`.
    fn lookup(&self, h: &BlockHash) -> Option<u32> {
        self.cached.get(h).copied()
    }

    /// Whether no request holds block `id`.
    fn is_free(&self, id: u32) -> bool {
        self.refs.get(id as usize).is_some_and(|&r| r == 0)
    }

    /// Hands out a block: a free one without a hash, else the least recently freed
    /// cached one, which leaves the cache.
    fn take(&mut self) -> Option<u32> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let (_, id) = self.evictable.pop_first()?;
                if let Some(h) = self.hash[id as usize].take() {
                    self.cached.remove(&h);
                    self.record_removed(h);
                }
                self.evictions += 1;
                id
            }
        };
        self.refs[id as usize] = 1;
        Some(id)
    }

    /// One more request holds cached block `id` (a prefix-cache hit).
    fn hold(&mut self, id: u32) {
        let i = id as usize;
        if self.refs[i] == 0 {
            self.evictable.remove(&self.freed_at[i]);
        }
        self.refs[i] += 1;
    }

    /// One request fewer holds block `id`; when none does, it is free (and, with a hash,
    /// evictable from now on).
    fn release(&mut self, id: u32) {
        let i = id as usize;
        debug_assert!(i < self.num_blocks && self.refs[i] > 0);
        self.refs[i] = self.refs[i].saturating_sub(1);
        if self.refs[i] > 0 {
            return;
        }
        if self.hash[i].is_some() {
            self.tick += 1;
            self.freed_at[i] = self.tick;
            self.evictable.insert(self.tick, id);
        } else {
            self.free.push(id);
        }
    }

    /// Makes the held block `id` findable by `h`, unless it already has a hash or another
    /// block already holds the same contents (that one stays the one found). True when
    /// `h` was not findable before.
    fn cache(&mut self, id: u32, h: BlockHash) -> bool {
        let i = id as usize;
        if self.hash[i].is_none() && !self.cached.contains_key(&h) {
            self.cached.insert(h, id);
            self.hash[i] = Some(h);
            return true;
        }
        false
    }

    /// Records that the block with hash `h` left the cache (when recording), in one
    /// [`KvCacheEvent::Removed`] with the removals just before it.
    fn record_removed(&mut self, h: BlockHash) {
        let Some(events) = &mut self.events else {
            return;
        };
        match events.last_mut() {
            Some(KvCacheEvent::Removed { hashes }) => hashes.push(h),
            _ => events.push(KvCacheEvent::Removed { hashes: vec![h] }),
        }
    }

    /// Records that blocks `run` of a sequence (`hashes`, `tokens`) became findable
    /// (when recording).
    fn record_stored(
        &mut self,
        hashes: &[BlockHash],
        tokens: &[u32],
        block_size: usize,
        run: std::ops::Range<usize>,
    ) {
        let Some(events) = &mut self.events else {
            return;
        };
        let parent = run.start.checked_sub(1).map(|p| hashes[p]);
        events.push(KvCacheEvent::Stored {
            hashes: hashes[run.clone()].to_vec(),
            parent,
            tokens: tokens[run.start * block_size..run.end * block_size].to_vec(),
        });
    }

    /// Forgets every hash: cached free blocks become plain free blocks.
    fn clear_cache(&mut self) {
        if let Some(events) = &mut self.events {
            // What came before no longer matters to a reader.
            events.clear();
            events.push(KvCacheEvent::AllCleared);
        }
        self.cached.clear();
        for h in &mut self.hash {
            *h = None;
        }
        // Handed out after the plain free blocks, least recently freed first.
        let mut free: Vec<u32> = std::mem::take(&mut self.evictable)
            .into_values()
            .rev()
            .collect();
        free.append(&mut self.free);
        self.free = free;
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

/// The longest prefix of a token sequence whose blocks every group has cached, as
/// [`KvCacheManager::find_cached_prefix`] found it; [`KvCacheManager::allocate_with_prefix`]
/// takes its blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Tokens it covers: whole blocks, always fewer than the tokens looked up.
    pub num_tokens: usize,
    /// Tokens looked up (0 when prefix caching is off).
    pub num_queried: usize,
    /// The chained hashes of the full blocks of the tokens looked up.
    hashes: Vec<BlockHash>,
    /// Per group: the cached blocks the group needs (`NO_BLOCK` before a sliding
    /// group's window); empty when nothing was found.
    tables: Vec<Vec<u32>>,
}

/// What the prefix cache has done since the manager was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt tokens looked up at admission (re-admissions after preemption included).
    pub queries: u64,
    /// Of those, tokens found cached (not computed again).
    pub hits: u64,
    /// Blocks findable by hash now, over all groups (held or free).
    pub cached_blocks: usize,
    /// Cached blocks handed out again for other contents, over all groups.
    pub evictions: u64,
}

#[derive(Clone, Debug)]
struct Group {
    spec: KvGroupSpec,
    pool: BlockPool,
}

/// The blocks one request holds.
#[derive(Clone, Debug)]
struct RequestBlocks {
    /// Per group: logical block index -> block id (`NO_BLOCK` where freed or never needed).
    tables: Vec<Vec<u32>>,
    /// The chained hashes of the request's first full blocks.
    hashes: Vec<BlockHash>,
    /// Leading blocks already offered to the cache, in every group.
    num_offered: usize,
}

/// Hands out KV blocks to requests, one block table per request per group, and keeps
/// freed full blocks findable by hash (the prefix cache).
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    block_size: usize,
    groups: Vec<Group>,
    requests: HashMap<RequestId, RequestBlocks>,
    prefix_caching: bool,
    queries: u64,
    hits: u64,
}

impl KvCacheManager {
    /// A manager over `groups`, with `blocks_per_group[g]` blocks of `block_size` tokens
    /// (a recurrent group: state slots) in group `g`'s pool, prefix caching on where
    /// [supported](Self::supports_prefix_caching).
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
            requests: HashMap::new(),
            prefix_caching: true,
            queries: 0,
            hits: 0,
        }
        .with_prefix_caching_checked()
    }

    fn with_prefix_caching_checked(mut self) -> Self {
        self.prefix_caching = self.supports_prefix_caching();
        self
    }

    /// Whether prefix caching can be on: not with a recurrent group, whose state after
    /// a prefix is not kept.
    pub fn supports_prefix_caching(&self) -> bool {
        self.groups
            .iter()
            .all(|g| g.spec.kind != GroupKind::Recurrent)
    }

    /// Turns prefix caching on or off (off: no block is hashed or found, and the blocks
    /// cached so far become plain free blocks once free). It stays off where it is not
    /// [supported](Self::supports_prefix_caching).
    pub fn set_prefix_caching(&mut self, on: bool) {
        self.prefix_caching = on && self.supports_prefix_caching();
        if !on {
            for g in &mut self.groups {
                g.pool.clear_cache();
            }
        }
    }

    /// Forgets every cached block and zeroes the counters, as if no request had run
    /// (the server's warm-up request leaves no trace this way). Blocks that requests
    /// hold stay theirs.
    pub fn reset_prefix_cache(&mut self) {
        for g in &mut self.groups {
            g.pool.clear_cache();
            g.pool.evictions = 0;
        }
        self.queries = 0;
        self.hits = 0;
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Starts (or stops) recording the first group's cache events for
    /// [`take_events`](Self::take_events). Stopping drops what was not taken.
    pub fn set_event_log(&mut self, on: bool) {
        if let Some(g) = self.groups.first_mut() {
            g.pool.events = on.then(Vec::new);
        }
    }

    /// The cache events recorded since the last call, oldest first (none when not
    /// recording).
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        self.groups
            .first_mut()
            .and_then(|g| g.pool.events.as_mut())
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The prefix cache's counters.
    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            queries: self.queries,
            hits: self.hits,
            cached_blocks: self.groups.iter().map(|g| g.pool.num_cached()).sum(),
            evictions: self.groups.iter().map(|g| g.pool.evictions).sum(),
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

    /// Free blocks of group `g` (cached ones no request holds included).
    pub fn num_free(&self, g: usize) -> usize {
        self.groups[g].pool.num_free()
    }

    /// Cached blocks of group `g` (findable by hash, held or free).
    pub fn num_cached(&self, g: usize) -> usize {
        self.groups[g].pool.num_cached()
    }

    /// True when no request holds any block.
    pub fn all_free(&self) -> bool {
        self.groups
            .iter()
            .all(|g| g.pool.num_free() == g.pool.num_blocks())
    }

    /// The block table of request `req` in group `g` (empty for an unknown request).
    pub fn block_table(&self, req: RequestId, g: usize) -> &[u32] {
        self.requests
            .get(&req)
            .and_then(|r| r.tables.get(g))
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

    /// Blocks of `table` group `g` must newly hand out so that positions
    /// `first_query ..= last` are backed (the window of `first_query` included; a
    /// recurrent group: the state slot, when the table has none yet).
    fn missing(&self, table: &[u32], g: usize, first_query: usize, last: usize) -> usize {
        if self.groups[g].spec.kind == GroupKind::Recurrent {
            return usize::from(table.first().is_none_or(|&b| b == NO_BLOCK));
        }
        let bs = self.block_size;
        let lo = self.first_needed(g, first_query) / bs;
        let hi = last / bs;
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
            let needed = match self.groups[g].spec.kind {
                GroupKind::Recurrent => 1,
                _ => (end - 1) / bs + 1 - self.first_needed(g, first_query) / bs,
            };
            needed <= self.groups[g].pool.num_blocks()
        })
    }

    /// Whether `allocate(req, first_query, end)` would succeed.
    pub fn can_allocate(&self, req: RequestId, first_query: usize, end: usize) -> bool {
        if end == 0 {
            return true;
        }
        (0..self.groups.len()).all(|g| {
            self.missing(self.block_table(req, g), g, first_query, end - 1)
                <= self.groups[g].pool.num_free()
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
            let needed = self.missing(self.block_table(req, g), g, first_query, end - 1);
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
        let r = self.requests.entry(req).or_insert_with(|| RequestBlocks {
            tables: vec![Vec::new(); n_groups],
            hashes: Vec::new(),
            num_offered: 0,
        });
        for (g, group) in self.groups.iter_mut().enumerate() {
            let table = &mut r.tables[g];
            if group.spec.kind == GroupKind::Recurrent {
                match table.first_mut() {
                    Some(slot) if *slot != NO_BLOCK => {}
                    // Counted above: the pool has a slot.
                    _ => *table = vec![group.pool.take().unwrap_or(NO_BLOCK)],
                }
                continue;
            }
            let lo = window_start(first_query, group.spec.kind.window()) / bs;
            let hi = (end - 1) / bs;
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

    /// The longest prefix of `tokens` that every group can supply from its cache: a
    /// full-attention group needs every block of the prefix, a sliding group only the
    /// blocks the window of the first token after it still sees. At least one token is
    /// always left to compute (its logits are the ones sampled). Nothing is taken yet.
    pub fn find_cached_prefix(&self, tokens: &[u32]) -> CachedPrefix {
        if !self.prefix_caching || tokens.is_empty() {
            return CachedPrefix::default();
        }
        let bs = self.block_size;
        let mut hashes = Vec::new();
        extend_hashes(&mut hashes, tokens, bs, tokens.len() / bs);
        let limit = (tokens.len() - 1) / bs;
        let found: Vec<Vec<Option<u32>>> = self
            .groups
            .iter()
            .map(|g| hashes[..limit].iter().map(|h| g.pool.lookup(h)).collect())
            .collect();
        // The longest prefix each group allows, shortened until all groups agree: a
        // sliding group may allow `k` blocks but not `k - 1` (that window reaches one
        // block further back), so one pass is not enough.
        let mut k = limit;
        loop {
            let before = k;
            for g in 0..self.groups.len() {
                k = self.longest_usable(g, &found[g], k);
            }
            if k == before {
                break;
            }
        }
        if k == 0 {
            return CachedPrefix {
                num_queried: tokens.len(),
                hashes,
                ..CachedPrefix::default()
            };
        }
        let tables = (0..self.groups.len())
            .map(|g| {
                let lo = self.first_needed(g, k * bs) / bs;
                (0..k)
                    .map(|i| match found[g][i] {
                        Some(b) if i >= lo => b,
                        _ => NO_BLOCK,
                    })
                    .collect()
            })
            .collect();
        CachedPrefix {
            num_tokens: k * bs,
            num_queried: tokens.len(),
            hashes,
            tables,
        }
    }

    /// The most blocks, at most `limit`, a prefix can have for group `g` to supply
    /// what it needs of it from `found` (its cached block per block index).
    fn longest_usable(&self, g: usize, found: &[Option<u32>], limit: usize) -> usize {
        let bs = self.block_size;
        // `last_miss[j]`: one past the last uncached block before block `j`.
        let mut last_miss = vec![0usize; limit + 1];
        for j in 1..=limit {
            last_miss[j] = if found[j - 1].is_none() {
                j
            } else {
                last_miss[j - 1]
            };
        }
        (1..=limit)
            .rev()
            .find(|&j| last_miss[j] <= self.first_needed(g, j * bs) / bs)
            .unwrap_or(0)
    }

    /// Gives request `req` (which holds no blocks) the cached blocks of `prefix`, found
    /// by [`find_cached_prefix`](Self::find_cached_prefix) with no block handed out
    /// since, and new blocks for queries `prefix.num_tokens .. end`. All or nothing, like [`allocate`](Self::allocate);
    /// on success the lookup counts in the [`PrefixCacheStats`].
    pub fn allocate_with_prefix(
        &mut self,
        req: RequestId,
        prefix: &CachedPrefix,
        end: usize,
    ) -> Result<(), OutOfBlocks> {
        let start = prefix.num_tokens;
        if start > 0 {
            let empty = Vec::new();
            for g in 0..self.groups.len() {
                let table = prefix.tables.get(g).unwrap_or(&empty);
                // Cached blocks no request holds are counted free: taking them leaves
                // fewer for the new ones.
                let reclaimed = table
                    .iter()
                    .filter(|&&b| b != NO_BLOCK && self.groups[g].pool.is_free(b))
                    .count();
                let needed = self.missing(table, g, start, end.max(start + 1) - 1) + reclaimed;
                let free = self.groups[g].pool.num_free();
                if needed > free {
                    return Err(OutOfBlocks {
                        group: g,
                        needed,
                        free,
                    });
                }
            }
            for (g, table) in prefix.tables.iter().enumerate() {
                for (i, &b) in table.iter().enumerate().filter(|(_, &b)| b != NO_BLOCK) {
                    let pool = &mut self.groups[g].pool;
                    // Nothing was handed out since the lookup, so nothing was evicted.
                    debug_assert_eq!(pool.hash[b as usize], prefix.hashes.get(i).copied());
                    pool.hold(b);
                }
            }
            let k = start / self.block_size;
            self.requests.insert(
                req,
                RequestBlocks {
                    tables: prefix.tables.clone(),
                    hashes: prefix.hashes.clone(),
                    num_offered: k,
                },
            );
        }
        if let Err(e) = self.allocate(req, start, end) {
            // Checked above; undo the holds all the same.
            self.free(req);
            return Err(e);
        }
        if self.prefix_caching {
            self.queries += prefix.num_queried as u64;
            self.hits += start as u64;
        }
        if start == 0 {
            if let Some(r) = self.requests.get_mut(&req) {
                r.hashes = prefix.hashes.clone();
            }
        }
        Ok(())
    }

    /// Offers to the cache the blocks of `req` that the first `num_computed` of `tokens`
    /// (its tokens so far) fill completely: each becomes findable by its chained hash.
    /// Call after a step, before [`free_out_of_window`](Self::free_out_of_window).
    pub fn cache_computed(&mut self, req: RequestId, tokens: &[u32], num_computed: usize) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let Some(r) = self.requests.get_mut(&req) else {
            return;
        };
        let full = num_computed.min(tokens.len()) / bs;
        if full <= r.num_offered {
            return;
        }
        extend_hashes(&mut r.hashes, tokens, bs, full);
        let full = full.min(r.hashes.len());
        for (g, group) in self.groups.iter_mut().enumerate() {
            // The start of the run of newly findable blocks being recorded.
            let mut run: Option<usize> = None;
            for i in r.num_offered..full {
                let new = match r.tables[g].get(i) {
                    Some(&b) if b != NO_BLOCK => group.pool.cache(b, r.hashes[i]),
                    _ => false,
                };
                if group.pool.events.is_none() {
                    continue;
                }
                match (new, run) {
                    (true, None) => run = Some(i),
                    (false, Some(start)) => {
                        group.pool.record_stored(&r.hashes, tokens, bs, start..i);
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(start) = run {
                group.pool.record_stored(&r.hashes, tokens, bs, start..full);
            }
        }
        r.num_offered = full;
    }

    /// Returns to the pools the blocks of `req` that no query at `next_pos` or later can
    /// read (sliding groups only). Call after a step with the position of the next token.
    pub fn free_out_of_window(&mut self, req: RequestId, next_pos: usize) {
        let bs = self.block_size;
        let Some(r) = self.requests.get_mut(&req) else {
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
            for slot in r.tables[g].iter_mut().take(whole_blocks) {
                if *slot != NO_BLOCK {
                    group.pool.release(*slot);
                    *slot = NO_BLOCK;
                }
            }
        }
    }

    /// Returns every block of `req` (finish, abort, preemption). Its last blocks are
    /// freed first, so that the cache evicts a prefix's tail before its head.
    pub fn free(&mut self, req: RequestId) {
        if let Some(r) = self.requests.remove(&req) {
            for (g, table) in r.tables.into_iter().enumerate() {
                for b in table.into_iter().rev() {
                    if b != NO_BLOCK {
                        self.groups[g].pool.release(b);
                    }
                }
            }
        }
    }

    /// The state slot of `req` in recurrent group `g` (`None` before its first
    /// allocation, or where `g` is not recurrent).
    pub fn state_slot(&self, req: RequestId, g: usize) -> Option<u32> {
        let recurrent = self
            .groups
            .get(g)
            .is_some_and(|grp| grp.spec.kind == GroupKind::Recurrent);
        let slot = self.block_table(req, g).first().copied()?;
        (recurrent && slot != NO_BLOCK).then_some(slot)
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

    /// Qwen 3.5's layout: three linear-attention layers, then a full one.
    fn with_recurrent() -> Vec<KvGroupSpec> {
        use LayerCache::{Full, Recurrent};
        groups_from_layers(&[Recurrent, Recurrent, Recurrent, Full], None)
    }

    #[test]
    fn recurrent_layers_form_their_own_group() {
        let g = with_recurrent();
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].kind, g[0].layers.clone()), (GroupKind::Full, vec![3]));
        assert_eq!(
            (g[1].kind, g[1].layers.clone()),
            (GroupKind::Recurrent, vec![0, 1, 2])
        );
        let g = groups_from_layers(
            &[LayerCache::Sliding, LayerCache::Recurrent, LayerCache::Full],
            Some(8),
        );
        let kinds: Vec<GroupKind> = g.iter().map(|g| g.kind).collect();
        assert_eq!(
            kinds,
            [
                GroupKind::Full,
                GroupKind::Sliding { window: 8 },
                GroupKind::Recurrent
            ]
        );
    }

    #[test]
    fn a_request_holds_one_state_slot_whatever_its_length() {
        // 8 full-attention blocks of 4 tokens, 2 state slots.
        let mut m = KvCacheManager::new(with_recurrent(), 4, &[8, 2]);
        m.allocate(1, 0, 5).unwrap();
        let slot = m
            .state_slot(1, 1)
            .expect("a slot after the first allocation");
        assert_eq!(m.block_table(1, 1), &[slot]);
        assert_eq!((m.live_blocks(1, 0), m.live_blocks(1, 1)), (2, 1));
        // Growing (chunks, decode steps) keeps the same slot and takes none.
        m.allocate(1, 5, 13).unwrap();
        m.allocate(1, 13, 14).unwrap();
        assert_eq!(m.state_slot(1, 1), Some(slot));
        assert_eq!((m.live_blocks(1, 0), m.num_free(1)), (4, 1));
        // The last slot goes to a second request; a third finds none, and the error
        // names the recurrent group; nothing was allocated for it in the other group.
        m.allocate(2, 0, 3).unwrap();
        assert_ne!(m.state_slot(2, 1), Some(slot));
        assert!(!m.can_allocate(3, 0, 1));
        assert_eq!(
            m.allocate(3, 0, 1),
            Err(OutOfBlocks {
                group: 1,
                needed: 1,
                free: 0
            })
        );
        assert_eq!(m.live_blocks(3, 0), 0);
        // A finished (or preempted) request gives its slot back with its blocks.
        m.free(1);
        assert_eq!(m.state_slot(1, 1), None);
        m.allocate(3, 0, 1).unwrap();
        assert_eq!(m.state_slot(3, 1), Some(slot));
        m.free(2);
        m.free(3);
        assert!(m.all_free());
        // Only the attention groups bound a prompt's length.
        assert!(m.fits_when_empty(0, 32));
        assert!(!m.fits_when_empty(0, 33));
        // Not a recurrent group: no state slot.
        m.allocate(4, 0, 1).unwrap();
        assert_eq!(m.state_slot(4, 0), None);
    }

    #[test]
    fn prefix_caching_stays_off_with_a_recurrent_group() {
        let mut m = KvCacheManager::new(with_recurrent(), 4, &[8, 2]);
        assert!(!m.supports_prefix_caching());
        assert!(!m.prefix_caching());
        m.set_prefix_caching(true);
        assert!(!m.prefix_caching());
        let tokens: Vec<u32> = (0..12).collect();
        m.allocate(1, 0, 12).unwrap();
        m.cache_computed(1, &tokens, 12);
        m.free(1);
        let p = m.find_cached_prefix(&tokens);
        assert_eq!((p.num_tokens, p.num_queried), (0, 0));
        assert_eq!(m.prefix_cache_stats().cached_blocks, 0);
        // Without the recurrent group the same steps hit the cache.
        let mut a = KvCacheManager::new(groups_from_pattern(&[false], None), 4, &[8]);
        assert!(a.supports_prefix_caching() && a.prefix_caching());
        a.allocate(1, 0, 12).unwrap();
        a.cache_computed(1, &tokens, 12);
        a.free(1);
        assert_eq!(a.find_cached_prefix(&tokens).num_tokens, 8);
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

    /// Runs request `req` over `tokens` as the scheduler would: chunks of `chunk`
    /// tokens, each step's blocks offered to the cache and the window trimmed.
    fn compute(m: &mut KvCacheManager, req: RequestId, tokens: &[u32], from: usize, chunk: usize) {
        let mut pos = from;
        while pos < tokens.len() {
            let end = (pos + chunk).min(tokens.len());
            m.allocate(req, pos, end).unwrap();
            pos = end;
            m.cache_computed(req, tokens, pos);
            m.free_out_of_window(req, pos);
        }
    }

    /// Admits `req` after its cached prefix and computes the rest; returns where it started.
    fn admit(m: &mut KvCacheManager, req: RequestId, tokens: &[u32], chunk: usize) -> usize {
        let prefix = m.find_cached_prefix(tokens);
        let start = prefix.num_tokens;
        let end = (start + chunk).min(tokens.len());
        m.allocate_with_prefix(req, &prefix, end).unwrap();
        m.cache_computed(req, tokens, end);
        m.free_out_of_window(req, end);
        compute(m, req, tokens, end, chunk);
        start
    }

    #[test]
    fn block_hashes_chain_over_every_earlier_block() {
        let a = hash_block(None, &[1, 2, 3, 4], &[]);
        assert_eq!(a, hash_block(None, &[1, 2, 3, 4], &[]), "deterministic");
        assert_ne!(a, hash_block(None, &[1, 2, 3, 5], &[]));
        assert_ne!(a, hash_block(None, &[1, 2, 3, 4], &[7]), "extra keys count");
        let b = hash_block(Some(&a), &[1, 2, 3, 4], &[]);
        assert_ne!(a, b, "the parent counts");
        // The same second block after different first blocks: different identities.
        let mut x = Vec::new();
        let mut y = Vec::new();
        extend_hashes(&mut x, &[1, 2, 3, 4, 9, 9, 9, 9], 4, 2);
        extend_hashes(&mut y, &[1, 2, 3, 0, 9, 9, 9, 9], 4, 2);
        assert_eq!(x[0], a);
        assert_ne!(x[1], y[1]);
        // Only full blocks are hashed.
        let mut z = Vec::new();
        extend_hashes(&mut z, &[1, 2, 3, 4, 5], 4, 2);
        assert_eq!(z, vec![a]);
    }

    #[test]
    fn a_shared_prefix_hits_in_every_group() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[32, 32]);
        let first: Vec<u32> = (0..20).collect();
        assert_eq!(admit(&mut m, 1, &first, 8), 0, "nothing cached yet");
        let full_blocks = m.block_table(1, 0).to_vec();
        m.free(1);
        assert!(m.all_free());
        // Every full block was cached in both groups (the sliding group's early blocks
        // before they left the window).
        assert_eq!(m.num_cached(0), 5);
        assert_eq!(m.num_cached(1), 5);
        // 16 tokens in common, then different ones.
        let second: Vec<u32> = (0..16).chain(100..105).collect();
        let p = m.find_cached_prefix(&second);
        assert_eq!(p.num_tokens, 16);
        assert_eq!(p.num_queried, 21);
        m.allocate_with_prefix(2, &p, 21).unwrap();
        assert_eq!(
            &m.block_table(2, 0)[..4],
            &full_blocks[..4],
            "the same full blocks"
        );
        // The first query at 16 sees 9..=16: sliding blocks 2 and 3, not 0 and 1.
        let t = m.block_table(2, 1);
        assert_eq!(&t[..2], &[NO_BLOCK, NO_BLOCK]);
        assert!(t[2..4].iter().all(|&b| b != NO_BLOCK));
        let stats = m.prefix_cache_stats();
        assert_eq!((stats.queries, stats.hits), (20 + 21, 16));
        // A prompt the cache holds whole still leaves its last token to compute.
        let p = m.find_cached_prefix(&first[..16]);
        assert_eq!(p.num_tokens, 12);
        m.free(2);
        assert!(m.all_free());
    }

    #[test]
    fn a_sliding_group_needs_only_the_blocks_its_window_sees() {
        // A sliding pool of 8 blocks: after request 1 (5 blocks) another request of 5
        // blocks evicts the two least recently freed, request 1's blocks 0 and 1.
        let mut m = KvCacheManager::new(hybrid(), 4, &[32, 8]);
        let first: Vec<u32> = (0..20).collect();
        admit(&mut m, 1, &first, 20);
        m.free(1);
        m.allocate(9, 0, 20).unwrap();
        assert_eq!(m.num_cached(1), 3, "two sliding blocks evicted");
        m.free(9);
        let longer: Vec<u32> = (0..21).collect();
        let p = m.find_cached_prefix(&longer);
        // The first query at 20 sees 13..=20: sliding blocks 3 and 4 are all it needs.
        assert_eq!(p.num_tokens, 20);
        m.allocate_with_prefix(2, &p, 21).unwrap();
        assert_eq!(m.live_blocks(2, 0), 6);
        let t = m.block_table(2, 1);
        assert_eq!(&t[..3], &[NO_BLOCK; 3]);
        assert_eq!(
            m.live_blocks(2, 1),
            3,
            "blocks 3 and 4 from the cache, 5 new"
        );
        m.free(2);
        // Two more evictions (blocks 2 and 4, the least recently freed): every prefix's
        // window now reaches an evicted sliding block, though the full group has them all.
        m.allocate(9, 0, 28).unwrap();
        m.free(9);
        assert_eq!(m.num_cached(1), 1);
        assert_eq!(m.num_cached(0), 5);
        assert_eq!(m.find_cached_prefix(&longer).num_tokens, 0);
        assert!(m.all_free());
    }

    #[test]
    fn eviction_takes_plain_blocks_first_then_the_least_recently_freed() {
        let mut pool = BlockPool::new(5);
        let ids: Vec<u32> = (0..4).map(|_| pool.take().unwrap()).collect();
        let hashes: Vec<BlockHash> = (0..4u32).map(|i| hash_block(None, &[i], &[])).collect();
        for (&id, &h) in ids.iter().zip(&hashes) {
            pool.cache(id, h);
        }
        for i in [2, 0, 3, 1] {
            pool.release(ids[i]);
        }
        assert_eq!(pool.num_free(), 5);
        // A hit takes block 3 out of the eviction queue.
        pool.hold(ids[3]);
        assert_eq!(pool.num_free(), 4);
        assert_eq!(pool.take(), Some(4), "the plain free block goes first");
        assert_eq!(pool.take(), Some(ids[2]), "then the least recently freed");
        assert_eq!(
            pool.lookup(&hashes[2]),
            None,
            "an evicted block is not found"
        );
        assert_eq!(pool.take(), Some(ids[0]));
        assert_eq!(pool.take(), Some(ids[1]));
        assert_eq!(pool.take(), None, "block 3 is held");
        assert_eq!(pool.lookup(&hashes[3]), Some(ids[3]));
    }

    #[test]
    fn shared_blocks_are_counted_and_free_once_nobody_holds_them() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[16, 16]);
        let a: Vec<u32> = (0..17).collect();
        admit(&mut m, 1, &a, 17);
        // Request 2 shares request 1's first four blocks while 1 still runs.
        let b: Vec<u32> = (0..16).chain([50, 51]).collect();
        assert_eq!(admit(&mut m, 2, &b, 18), 16);
        assert_eq!(m.block_table(2, 0)[..4], m.block_table(1, 0)[..4]);
        // 5 blocks of 1, 4 shared, 1 of 2's own in the full group.
        assert_eq!(m.num_free(0), 16 - 6);
        m.free(1);
        assert_eq!(
            m.num_free(0),
            16 - 5,
            "the shared blocks are still held by 2"
        );
        m.free(2);
        assert!(m.all_free());
        // Freed blocks stay findable.
        assert_eq!(m.find_cached_prefix(&b).num_tokens, 16);
    }

    #[test]
    fn without_prefix_caching_nothing_is_found() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[16, 16]);
        let a: Vec<u32> = (0..17).collect();
        admit(&mut m, 1, &a, 17);
        m.free(1);
        m.set_prefix_caching(false);
        assert_eq!(m.num_cached(0), 0);
        assert_eq!(admit(&mut m, 2, &a, 17), 0);
        m.free(2);
        assert_eq!(m.prefix_cache_stats().cached_blocks, 0);
        assert!(m.all_free());
    }

    /// The chained hashes of the full blocks of `tokens`, computed here with
    /// [`hash_block`] alone (not through the manager).
    fn chain(tokens: &[u32], bs: usize) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::new();
        for block in tokens.chunks_exact(bs) {
            let h = hash_block(out.last(), block, &[]);
            out.push(h);
        }
        out
    }

    #[test]
    fn no_events_are_recorded_unless_asked() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[8, 8]);
        let a: Vec<u32> = (0..12).collect();
        admit(&mut m, 1, &a, 12);
        m.free(1);
        m.reset_prefix_cache();
        assert_eq!(m.take_events(), vec![]);
    }

    #[test]
    fn stored_blocks_are_reported_once_with_their_parent_and_tokens() {
        let mut m = KvCacheManager::new(hybrid(), 4, &[32, 32]);
        m.set_event_log(true);
        // 10 tokens in chunks of 6: block 0 after the first chunk, block 1 after the
        // second (block 2 is not full).
        let a: Vec<u32> = (10..20).collect();
        admit(&mut m, 1, &a, 6);
        let h = chain(&a, 4);
        assert_eq!(
            m.take_events(),
            vec![
                KvCacheEvent::Stored {
                    hashes: vec![h[0]],
                    parent: None,
                    tokens: a[..4].to_vec(),
                },
                KvCacheEvent::Stored {
                    hashes: vec![h[1]],
                    parent: Some(h[0]),
                    tokens: a[4..8].to_vec(),
                },
            ]
        );
        assert_eq!(m.take_events(), vec![], "drained");
        // A second request with the same first 8 tokens hits them: nothing new is
        // stored for them; its own third block is, after the second shared one.
        let b: Vec<u32> = (10..18).chain([7, 7, 7, 7, 7]).collect();
        assert_eq!(admit(&mut m, 2, &b, 16), 8);
        let hb = chain(&b, 4);
        assert_eq!(hb[..2], h[..2]);
        assert_eq!(
            m.take_events(),
            vec![KvCacheEvent::Stored {
                hashes: vec![hb[2]],
                parent: Some(h[1]),
                tokens: vec![7, 7, 7, 7],
            }]
        );
        // Two requests computing the same blocks: only the first to finish them
        // makes them findable, and only that is reported.
        m.free(1);
        m.free(2);
        let c: Vec<u32> = (50..59).collect();
        for req in [3, 4] {
            m.allocate(req, 0, c.len()).unwrap();
        }
        m.cache_computed(3, &c, c.len());
        m.cache_computed(4, &c, c.len());
        let hc = chain(&c, 4);
        assert_eq!(
            m.take_events(),
            vec![KvCacheEvent::Stored {
                hashes: hc.clone(),
                parent: None,
                tokens: c[..8].to_vec(),
            }]
        );
    }

    #[test]
    fn evicted_blocks_are_reported_removed_tail_first_and_a_reset_clears_all() {
        // One full-attention group of 4 blocks of 4 tokens: one 16-token request fills it.
        let full = vec![KvGroupSpec {
            kind: GroupKind::Full,
            layers: vec![0],
        }];
        let mut m = KvCacheManager::new(full, 4, &[4]);
        m.set_event_log(true);
        let a: Vec<u32> = (0..16).collect();
        admit(&mut m, 1, &a, 16);
        m.free(1);
        let h = chain(&a, 4);
        assert!(matches!(
            m.take_events().as_slice(),
            [KvCacheEvent::Stored { hashes, .. }] if *hashes == h
        ));
        // Two blocks for other tokens: the least recently freed cached blocks go,
        // which are the tail of `a` (freed last to first).
        let b: Vec<u32> = (100..108).collect();
        assert_eq!(admit(&mut m, 2, &b, 8), 0);
        let events = m.take_events();
        assert_eq!(
            events[0],
            KvCacheEvent::Removed {
                hashes: vec![h[3], h[2]]
            }
        );
        assert_eq!(
            events[1],
            KvCacheEvent::Stored {
                hashes: chain(&b, 4),
                parent: None,
                tokens: b.clone(),
            }
        );
        assert_eq!(events.len(), 2);
        // What the manager still finds agrees with what was reported.
        assert_eq!(m.find_cached_prefix(&a).num_tokens, 8);
        m.free(2);
        m.reset_prefix_cache();
        assert_eq!(m.take_events(), vec![KvCacheEvent::AllCleared]);
        // Turning the log off drops what was recorded and records nothing more.
        admit(&mut m, 3, &a, 16);
        m.set_event_log(false);
        m.free(3);
        m.reset_prefix_cache();
        assert_eq!(m.take_events(), vec![]);
    }

    #[test]
    fn the_integer_form_of_a_hash_is_its_last_eight_bytes_big_endian() {
        let h = hash_block(None, &[1, 2, 3, 4], &[]);
        let b = h.as_bytes();
        let want = b[24..]
            .iter()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
        assert_eq!(h.to_u64(), want);
        assert_ne!(h.to_u64(), hash_block(None, &[1, 2, 3, 5], &[]).to_u64());
    }
}
