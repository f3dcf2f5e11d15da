//! Recording: ops are recorded into one command buffer and submitted together when the
//! host needs a result (a download, routing ids, a host-memory output) or at the end of
//! a step. Per-op host data (index arguments, host-memory views) goes into an arena of
//! host-visible buffers that lives until that submission has completed; every buffer a
//! recorded command uses is held until then too, so dropping a tensor never frees memory
//! the GPU still reads.

use std::sync::Arc;

use ash::vk;
use flint_hal::HalError;

use crate::context::{vk_err, Ctx, RawBuf, PUSH_BYTES};

/// Size of one arena chunk; a larger request gets a buffer of its own.
const ARENA_CHUNK: u64 = 4 << 20;

/// Descriptor sets per pool; a full pool submits what is recorded and starts over.
const SETS_PER_POOL: u32 = 2048;

/// A range of a host-visible arena buffer.
#[derive(Clone, Debug)]
pub struct Slice {
    pub buf: Arc<RawBuf>,
    pub offset: u64,
    pub size: u64,
}

impl Slice {
    /// Reads the slice's bytes back (after the submission that wrote them completed).
    pub fn read(&self, dst: &mut [u8]) {
        self.buf.read(self.offset as usize, dst);
    }
}

/// One storage-buffer binding of a dispatch.
#[derive(Clone, Debug)]
pub enum Bind {
    /// A whole buffer (shaders get element offsets in their push constants).
    Whole(Arc<RawBuf>),
    /// An arena range (element offset 0).
    Slice(Slice),
}

/// The command buffer being recorded and what it holds on to.
pub struct Recorder {
    ctx: Arc<Ctx>,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    desc_pool: vk::DescriptorPool,
    recording: bool,
    keep: Vec<Arc<RawBuf>>,
    /// Arena chunks and the bytes used of the last one.
    chunks: Vec<Arc<RawBuf>>,
    chunk: usize,
    used: u64,
    /// Commands recorded since the last submission.
    pub pending: usize,
    /// Submissions so far.
    pub submissions: u64,
    /// Dispatches so far.
    pub dispatches: u64,
    /// A device buffer for intermediate values of one op (rounded activations).
    scratch: Option<Arc<RawBuf>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("pending", &self.pending)
            .field("submissions", &self.submissions)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    pub fn new(ctx: Arc<Ctx>) -> Result<Recorder, HalError> {
        let d = &ctx.dev;
        // SAFETY: valid create infos; destroyed in Drop.
        let (pool, cmd, fence, desc_pool) = unsafe {
            let pool = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .queue_family_index(ctx.queue_family)
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                    None,
                )
                .map_err(vk_err("vkCreateCommandPool"))?;
            let cmd = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .map_err(vk_err("vkAllocateCommandBuffers"))?[0];
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(vk_err("vkCreateFence"))?;
            let sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: SETS_PER_POOL * crate::context::MAX_BINDINGS as u32,
            }];
            let desc_pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(SETS_PER_POOL)
                        .pool_sizes(&sizes),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorPool"))?;
            (pool, cmd, fence, desc_pool)
        };
        Ok(Recorder {
            ctx,
            pool,
            cmd,
            fence,
            desc_pool,
            recording: false,
            keep: Vec::new(),
            chunks: Vec::new(),
            chunk: 0,
            used: 0,
            pending: 0,
            submissions: 0,
            dispatches: 0,
            scratch: None,
        })
    }

    /// Whether nothing is recorded (so a mapped buffer may be written directly).
    pub fn is_idle(&self) -> bool {
        self.pending == 0
    }

    fn begin(&mut self) -> Result<(), HalError> {
        if !self.recording {
            // SAFETY: the command buffer is not in use (the last submission was waited).
            unsafe {
                self.ctx
                    .dev
                    .begin_command_buffer(
                        self.cmd,
                        &vk::CommandBufferBeginInfo::default()
                            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                    )
                    .map_err(vk_err("vkBeginCommandBuffer"))?;
            }
            self.recording = true;
        }
        Ok(())
    }

    /// Every write so far is visible to every later read (shader, transfer and host).
    fn barrier(&mut self) {
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE
                    | vk::AccessFlags::HOST_READ,
            )];
        // SAFETY: recording; a global barrier.
        unsafe {
            self.ctx.dev.cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            );
        }
    }

    /// `bytes` of host data in the arena, for a dispatch to read (or, written by one,
    /// to read back after [`flush`](Self::flush)).
    pub fn arena(&mut self, bytes: &[u8]) -> Result<Slice, HalError> {
        let s = self.arena_alloc(bytes.len() as u64)?;
        s.buf.write(s.offset as usize, bytes);
        Ok(s)
    }

    /// `len` bytes of arena space, contents unspecified.
    pub fn arena_alloc(&mut self, len: u64) -> Result<Slice, HalError> {
        let len = len.max(4);
        let align = self.ctx.limits.offset_align;
        if len > ARENA_CHUNK {
            let buf = Arc::new(self.ctx.buffer(len, true)?);
            self.keep.push(buf.clone());
            return Ok(Slice {
                buf,
                offset: 0,
                size: len,
            });
        }
        let mut off = self.used.div_ceil(align) * align;
        if self.chunks.is_empty() || off + len > ARENA_CHUNK {
            if !self.chunks.is_empty() {
                self.chunk += 1;
            }
            if self.chunk >= self.chunks.len() {
                let b = Arc::new(self.ctx.buffer(ARENA_CHUNK, true)?);
                self.chunks.push(b);
                self.chunk = self.chunks.len() - 1;
            }
            off = 0;
        }
        self.used = off + len;
        Ok(Slice {
            buf: self.chunks[self.chunk].clone(),
            offset: off,
            size: len,
        })
    }

    /// A storage buffer of at least `bytes` for one op's intermediate values. Ops are
    /// separated by barriers, so one buffer serves them all; a larger request replaces it
    /// (the old one lives on until the work that uses it completes).
    pub fn scratch(&mut self, bytes: u64) -> Result<Arc<RawBuf>, HalError> {
        match &self.scratch {
            Some(b) if b.size >= bytes => Ok(b.clone()),
            _ => {
                let b = Arc::new(self.ctx.buffer(bytes.next_power_of_two(), false)?);
                self.scratch = Some(b.clone());
                Ok(b)
            }
        }
    }

    /// Records a dispatch of `shader` over `groups` workgroups (spread over x and y),
    /// with `push` as its push constants.
    pub fn dispatch(
        &mut self,
        shader: &str,
        binds: &[Bind],
        push: &[u32],
        groups: u64,
    ) -> Result<(), HalError> {
        let max = u64::from(self.ctx.limits.max_groups);
        let x = groups.min(max);
        self.dispatch_grid(shader, binds, push, x, groups.div_ceil(x.max(1)))
    }

    /// Records a dispatch of `shader` over `x` workgroups by `rows`, the rows spread over
    /// y and z (row `wg.y + wg.z * num_workgroups.y`), so that a shader can derive
    /// per-row values from its workgroup id alone, uniform across the workgroup.
    pub fn dispatch_grid(
        &mut self,
        shader: &str,
        binds: &[Bind],
        push: &[u32],
        x: u64,
        rows: u64,
    ) -> Result<(), HalError> {
        if x == 0 || rows == 0 {
            return Ok(());
        }
        assert!(
            push.len() * 4 <= PUSH_BYTES as usize,
            "{shader}: push constants"
        );
        let ctx = self.ctx.clone();
        let p = ctx.pipeline(shader)?;
        assert_eq!(binds.len(), p.bindings, "{shader}: bindings");
        self.begin()?;
        let layouts = [p.set_layout];
        let set = loop {
            // SAFETY: a live pool and layout.
            let r = unsafe {
                ctx.dev.allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(self.desc_pool)
                        .set_layouts(&layouts),
                )
            };
            match r {
                Ok(s) => break s[0],
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL)
                    if self.pending > 0 =>
                {
                    self.flush()?;
                    self.begin()?;
                }
                Err(e) => return Err(vk_err("vkAllocateDescriptorSets")(e)),
            }
        };
        let infos: Vec<[vk::DescriptorBufferInfo; 1]> = binds
            .iter()
            .map(|b| match b {
                Bind::Whole(buf) => [vk::DescriptorBufferInfo {
                    buffer: buf.buffer,
                    offset: 0,
                    range: vk::WHOLE_SIZE,
                }],
                Bind::Slice(s) => [vk::DescriptorBufferInfo {
                    buffer: s.buf.buffer,
                    offset: s.offset,
                    range: s.size,
                }],
            })
            .collect();
        let writes: Vec<_> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(i as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        let max = u64::from(ctx.limits.max_groups);
        let y = rows.min(max);
        let z = rows.div_ceil(y);
        if x > max || z > max {
            return Err(HalError::invalid(format!(
                "vk: {shader}: {x} x {rows} workgroups exceed the device's grid"
            )));
        }
        let mut pc = [0u8; PUSH_BYTES as usize];
        pc[..push.len() * 4].copy_from_slice(bytemuck::cast_slice(push));
        // SAFETY: recording; the set, pipeline and layout are live and match; every
        // buffer bound is kept alive until the submission completes.
        unsafe {
            ctx.dev.update_descriptor_sets(&writes, &[]);
            ctx.dev
                .cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, p.pipeline);
            ctx.dev.cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                p.layout,
                0,
                &[set],
                &[],
            );
            ctx.dev
                .cmd_push_constants(self.cmd, p.layout, vk::ShaderStageFlags::COMPUTE, 0, &pc);
            ctx.dev.cmd_dispatch(self.cmd, x as u32, y as u32, z as u32);
        }
        for b in binds {
            match b {
                Bind::Whole(buf) => self.keep.push(buf.clone()),
                Bind::Slice(s) => self.keep.push(s.buf.clone()),
            }
        }
        self.barrier();
        self.pending += 1;
        self.dispatches += 1;
        Ok(())
    }

    /// Records `dst[dst_off..][..bytes] = src[src_off..][..bytes]`.
    pub fn copy(
        &mut self,
        src: &Arc<RawBuf>,
        src_off: u64,
        dst: &Arc<RawBuf>,
        dst_off: u64,
        bytes: u64,
    ) -> Result<(), HalError> {
        if bytes == 0 {
            return Ok(());
        }
        self.begin()?;
        let r = [vk::BufferCopy {
            src_offset: src_off,
            dst_offset: dst_off,
            size: bytes,
        }];
        // SAFETY: recording; both buffers are live and kept until completion; the
        // ranges are inside them (callers check view ranges).
        unsafe {
            self.ctx
                .dev
                .cmd_copy_buffer(self.cmd, src.buffer, dst.buffer, &r)
        };
        self.keep.push(src.clone());
        self.keep.push(dst.clone());
        self.barrier();
        self.pending += 1;
        Ok(())
    }

    /// Records zeroing `bytes` (a multiple of 4) of `dst` from `off`.
    pub fn fill_zero(&mut self, dst: &Arc<RawBuf>, off: u64, bytes: u64) -> Result<(), HalError> {
        if bytes == 0 {
            return Ok(());
        }
        self.begin()?;
        // SAFETY: recording; the buffer is live and kept until completion.
        unsafe {
            self.ctx
                .dev
                .cmd_fill_buffer(self.cmd, dst.buffer, off, bytes, 0)
        };
        self.keep.push(dst.clone());
        self.barrier();
        self.pending += 1;
        Ok(())
    }

    /// Submits what is recorded and waits for it; then releases what it held and resets
    /// the arena.
    pub fn flush(&mut self) -> Result<(), HalError> {
        if self.recording {
            let d = &self.ctx.dev;
            let cmds = [self.cmd];
            let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
            // SAFETY: a recorded command buffer, a live queue and an unsignalled fence;
            // we wait for the fence before touching anything the commands use.
            unsafe {
                d.end_command_buffer(self.cmd)
                    .map_err(vk_err("vkEndCommandBuffer"))?;
                self.recording = false;
                d.queue_submit(self.ctx.queue, &submit, self.fence)
                    .map_err(vk_err("vkQueueSubmit"))?;
                d.wait_for_fences(&[self.fence], true, u64::MAX)
                    .map_err(vk_err("vkWaitForFences"))?;
                d.reset_fences(&[self.fence])
                    .map_err(vk_err("vkResetFences"))?;
                d.reset_command_buffer(self.cmd, vk::CommandBufferResetFlags::empty())
                    .map_err(vk_err("vkResetCommandBuffer"))?;
                d.reset_descriptor_pool(self.desc_pool, vk::DescriptorPoolResetFlags::empty())
                    .map_err(vk_err("vkResetDescriptorPool"))?;
            }
            self.submissions += 1;
        }
        self.pending = 0;
        self.keep.clear();
        self.chunk = 0;
        self.used = 0;
        // Keep a few chunks for the next batch; give back the rest.
        self.chunks.truncate(4);
        Ok(())
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.flush();
        // SAFETY: nothing is in flight after the flush.
        unsafe {
            let _ = self.ctx.dev.device_wait_idle();
            self.ctx.dev.destroy_descriptor_pool(self.desc_pool, None);
            self.ctx.dev.destroy_fence(self.fence, None);
            self.ctx.dev.destroy_command_pool(self.pool, None);
        }
    }
}
