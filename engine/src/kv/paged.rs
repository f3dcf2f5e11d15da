//! The paged forward: a [`DeviceModel`] behind the [`StepModel`] interface of the
//! [`LLMEngine`](crate::sched::LLMEngine), with one KV buffer per layer sized by its
//! own group's pool, the Gated DeltaNet layers' states (one slot per block of the
//! recurrent group), and the KV cache manager sized from a memory budget.

use flint_hal::KvBuffer;

use crate::forward::{Batch, BatchSeq, DeviceModel, RecurrentStates};
use crate::kv::{GroupKind, KvCacheManager, KvGroupSpec};
use crate::model::ModelError;
use crate::sched::{StepModel, StepSeq};

/// Tokens per KV block.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// How to size the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSizing {
    /// Bytes for keys and values of every layer together.
    pub memory_bytes: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// Most requests running at once (bounds what the sliding group needs).
    pub max_num_seqs: usize,
    /// Token budget of one step (bounds the sliding group's peak within a chunk).
    pub max_num_batched_tokens: usize,
}

/// A [`DeviceModel`] with its paged KV buffers.
#[derive(Debug)]
pub struct PagedModel {
    model: DeviceModel,
    kv: Vec<Box<dyn KvBuffer>>,
    /// The Gated DeltaNet layers' states, one slot per block of the recurrent group.
    states: RecurrentStates,
    block_size: usize,
}

impl PagedModel {
    /// Sizes the pools from `sizing`, allocates every layer's KV buffer on the model's
    /// device, and returns the model with the matching KV cache manager.
    ///
    /// The sliding group needs at most `ceil((W + chunk - 1) / bs) + 1` blocks per running
    /// request, so its pool is capped at that times `max_num_seqs`; the recurrent group
    /// (Gated DeltaNet states) gets one slot per running request, `max_num_seqs`;
    /// everything else of the budget goes to the full-attention group.
    pub fn new(
        model: DeviceModel,
        sizing: &KvSizing,
    ) -> Result<(Self, KvCacheManager), ModelError> {
        let spec = model.spec().clone();
        let bs = sizing.block_size.max(1);
        let groups = model.kv_groups().to_vec();
        // Bytes of one block of each group: the sum over its layers of one block of that
        // layer (its own KV heads and head sizes; mimo2's and gemma4's differ per layer) at the device's size of a
        // stored key or value element (f16 on the CPU).
        let per_value = model.device().kv_bytes_per_value().max(1);
        // gemma4's shared-KV layers hold none (they read an earlier layer's).
        let layer_block = |il: usize| {
            let l = &spec.layers[il];
            if l.kv_source.is_some() {
                return 0;
            }
            (bs * l.n_kv_heads * (l.head_dim_k + l.head_dim_v) * per_value) as u64
        };
        let group_block: Vec<u64> = groups
            .iter()
            .map(|g| g.layers.iter().map(|&il| layer_block(il)).sum())
            .collect();
        // Start from the same block count for every group (the budget split evenly over
        // the layers), then cap each sliding group at what its running requests can ever
        // hold and give what that frees to the full-attention groups.
        let all_layers: u64 = group_block.iter().sum();
        let mut budget = sizing.memory_bytes;
        let mut blocks = vec![0usize; groups.len()];
        if let Some(g) = groups.iter().position(|g| g.kind == GroupKind::Recurrent) {
            let slots = sizing.max_num_seqs.max(1);
            let bytes = slots as u64 * RecurrentStates::bytes_per_slot(&spec);
            if bytes >= budget {
                return Err(ModelError::new(format!(
                    "a KV cache of {} bytes is too small: the recurrent states of {slots} \
                     sequences take {bytes} bytes ({} per sequence); raise --kv-memory or \
                     lower --max-num-seqs",
                    sizing.memory_bytes,
                    RecurrentStates::bytes_per_slot(&spec)
                )));
            }
            blocks[g] = slots;
            budget -= bytes;
        }
        let uniform = budget / all_layers.max(1);
        for (g, spec_g) in groups.iter().enumerate() {
            if let GroupKind::Sliding { window } = spec_g.kind {
                let per_seq = (window + sizing.max_num_batched_tokens).div_ceil(bs) + 1;
                let want = (per_seq * sizing.max_num_seqs.max(1)) as u64;
                blocks[g] = want.min(uniform) as usize;
                budget -= blocks[g] as u64 * group_block[g];
            }
        }
        let full: Vec<usize> = (0..groups.len())
            .filter(|&g| groups[g].kind == GroupKind::Full)
            .collect();
        let full_block: u64 = full.iter().map(|&g| group_block[g]).sum();
        for &g in &full {
            blocks[g] = (budget / full_block.max(1)) as usize;
        }
        // A device whose buffers are smaller than its memory (Vulkan's largest storage
        // binding) gets pools whose every layer's keys and values each fit one buffer; the
        // rest of the budget stays unused.
        if let Some(max) = model.device().max_buffer_bytes() {
            for (g, spec_g) in groups.iter().enumerate() {
                if spec_g.kind == GroupKind::Recurrent {
                    continue;
                }
                let widest = spec_g
                    .layers
                    .iter()
                    .map(|&il| {
                        let l = &spec.layers[il];
                        (bs * l.n_kv_heads * l.head_dim_k.max(l.head_dim_v) * per_value) as u64
                    })
                    .max()
                    .unwrap_or(0);
                if let Some(fit) = max.checked_div(widest) {
                    blocks[g] = blocks[g].min(fit as usize);
                }
            }
        }
        if let Some(g) = blocks.iter().position(|&b| b == 0) {
            return Err(ModelError::new(format!(
                "a KV cache of {} bytes is too small: group {g} gets no block of {bs} tokens \
                 ({} bytes per block over its layers); raise --kv-memory",
                sizing.memory_bytes, group_block[g]
            )));
        }
        Self::build(model, groups, bs, &blocks)
    }

    /// A model with exactly `blocks_per_group[g]` blocks of `block_size` tokens in KV
    /// group `g` (the model's [`DeviceModel::kv_groups`]: the full group first). For tests and tools that need a pool of a given size.
    pub fn with_pools(
        model: DeviceModel,
        block_size: usize,
        blocks_per_group: &[usize],
    ) -> Result<(Self, KvCacheManager), ModelError> {
        let groups = model.kv_groups().to_vec();
        if groups.len() != blocks_per_group.len() {
            return Err(ModelError::new(format!(
                "the model has {} KV groups but {} pool sizes were given",
                groups.len(),
                blocks_per_group.len()
            )));
        }
        if block_size == 0 || blocks_per_group.contains(&0) {
            return Err(ModelError::new(
                "every KV pool needs a positive block size and at least one block",
            ));
        }
        Self::build(model, groups, block_size, blocks_per_group)
    }

    fn build(
        model: DeviceModel,
        groups: Vec<KvGroupSpec>,
        bs: usize,
        blocks: &[usize],
    ) -> Result<(Self, KvCacheManager), ModelError> {
        let slots = groups
            .iter()
            .position(|g| g.kind == GroupKind::Recurrent)
            .map_or(0, |g| blocks[g]);
        let manager = KvCacheManager::new(groups, bs, blocks);
        let n_layers = model.spec().layers.len();
        let mut kv = Vec::with_capacity(n_layers);
        for il in 0..n_layers {
            // Each layer's buffer is sized by its own group's pool, the group whose block
            // tables the forward hands that layer.
            let g = model.layer_group(il);
            let layout = model.kv_layout(il, blocks[g], bs);
            kv.push(model.device().alloc_kv(&layout).map_err(ModelError::from)?);
        }
        let states = RecurrentStates::new(&model, slots)?;
        Ok((
            Self {
                model,
                kv,
                states,
                block_size: bs,
            },
            manager,
        ))
    }

    /// Faults every layer's KV buffer in now ([`KvBuffer::make_resident`]), so that no
    /// step pays the first touch of a block's pages: with prefix caching the pool hands
    /// out its never-used blocks before its cached ones, and a fresh huge page costs the
    /// kernel longer to zero than a decode step takes to write to it. What a server does
    /// before it reports healthy; a one-shot tool leaves the pages to be touched as used.
    pub fn make_kv_resident(&mut self) {
        for buf in &mut self.kv {
            buf.make_resident();
        }
    }

    /// The staged model.
    pub fn model(&self) -> &DeviceModel {
        &self.model
    }
}

impl StepModel for PagedModel {
    fn vocab_size(&self) -> usize {
        self.model.spec().vocab
    }

    fn device(&self) -> Option<flint_hal::DeviceRef> {
        Some(self.model.device().clone())
    }

    fn step(&mut self, seqs: &[StepSeq<'_>], kv: &KvCacheManager) -> Result<Vec<f32>, ModelError> {
        let mut batch = Batch {
            seqs: Vec::with_capacity(seqs.len()),
            block_size: self.block_size,
        };
        for s in seqs {
            let tables = (0..self.model.kv_groups().len())
                .map(|g| kv.block_table(s.id, g))
                .collect();
            batch.seqs.push(BatchSeq {
                tokens: s.tokens,
                start_pos: u32::try_from(s.start)
                    .map_err(|_| ModelError::new("position overflows u32"))?,
                block_tables: tables,
                all_logits: false,
            });
        }
        let logits = self.model.forward(&mut self.kv, &mut self.states, &batch)?;
        // One row per sequence; keep those of the sequences that sample.
        let vocab = self.vocab_size();
        if seqs.iter().all(|s| s.sample) {
            return Ok(logits);
        }
        let mut out = Vec::with_capacity(seqs.len() * vocab);
        for (i, s) in seqs.iter().enumerate() {
            if s.sample {
                out.extend_from_slice(&logits[i * vocab..(i + 1) * vocab]);
            }
        }
        Ok(out)
    }
}
