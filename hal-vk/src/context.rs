//! The Vulkan objects behind a `vk` device: instance, logical device, one compute queue,
//! memory types, buffers and the compute pipelines of the shaders (built on first use).

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use ash::vk;
use flint_hal::HalError;

use crate::shaders::SHADERS;

/// Bytes of push constants every pipeline declares (the minimum every Vulkan device
/// offers).
pub const PUSH_BYTES: u32 = 128;

/// The most storage buffers a shader binds.
pub const MAX_BINDINGS: usize = 8;

/// Turns a Vulkan error into the HAL's, naming the call.
pub fn vk_err(what: &str) -> impl Fn(vk::Result) -> HalError + '_ {
    move |e| match e {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            HalError::out_of_memory(format!("vk: {what}: {e}"))
        }
        _ => HalError::runtime(format!("vk: {what}: {e}")),
    }
}

/// The physical device chosen: its name, type and memory.
#[derive(Clone, Debug)]
pub struct Adapter {
    /// `deviceName`.
    pub name: String,
    /// Discrete, integrated, virtual or CPU (lavapipe).
    pub kind: String,
    /// The driver's name and version string.
    pub driver: String,
    /// The size of the largest device-local heap.
    pub memory_bytes: u64,
    /// Vulkan version the device reports.
    pub api: (u32, u32, u32),
}

/// Device limits the backend works within.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest storage-buffer binding: no buffer is made larger (weights larger
    /// than this are split into chunks of whole rows).
    pub max_range: u64,
    /// Alignment of a storage-buffer binding's offset.
    pub offset_align: u64,
    /// Workgroups per dispatch dimension.
    pub max_groups: u32,
    /// Invocations per subgroup in compute shaders, where the device can broadcast
    /// within a subgroup there (the `matmul_rows` kernel needs 8); 0 otherwise.
    pub subgroup_broadcast: u32,
    /// Whether shaders may use f64 (`shaderFloat64`, enabled when offered): the shaders
    /// that follow ggml's f64 sums run as written; elsewhere their `_f32` variants
    /// (f64 read as f32, `build.rs`) do.
    pub float64: bool,
}

/// A compute pipeline and its layout (handles owned by [`Ctx`]).
#[derive(Clone, Copy, Debug)]
pub struct Pipeline {
    pub pipeline: vk::Pipeline,
    pub layout: vk::PipelineLayout,
    pub set_layout: vk::DescriptorSetLayout,
    pub bindings: usize,
}

/// Instance, device, queue and pipelines. Shared (`Arc`) by every buffer, so that the
/// device outlives them.
pub struct Ctx {
    _entry: ash::Entry,
    instance: ash::Instance,
    pub dev: ash::Device,
    pub queue: vk::Queue,
    pub queue_family: u32,
    /// Memory type of storage buffers.
    storage_type: u32,
    /// Whether storage buffers are host-visible and coherent (lavapipe, unified memory):
    /// then they are mapped and written directly when no queued work reads them.
    pub storage_mapped: bool,
    /// Memory type of host buffers (arena, staging).
    host_type: u32,
    pub limits: Limits,
    pub adapter: Adapter,
    /// Pipelines built so far, by shader name: each is built on its first dispatch
    /// (a CPU implementation compiles a shader to machine code then, about a second
    /// each on lavapipe, so a model pays only for the shaders it uses).
    pipelines: Mutex<HashMap<&'static str, Pipeline>>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("adapter", &self.adapter)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn c_str(bytes: &[std::ffi::c_char]) -> String {
    // SAFETY: Vulkan fills these fixed arrays with NUL-terminated strings.
    let s = unsafe { CStr::from_ptr(bytes.as_ptr()) };
    s.to_string_lossy().into_owned()
}

/// Opens the Vulkan loader (`libvulkan.so.1`), without creating anything.
pub fn load_entry() -> Result<ash::Entry, HalError> {
    // SAFETY: loading the system's Vulkan loader runs its initialisers; it is the
    // library every Vulkan program loads.
    unsafe { ash::Entry::load() }.map_err(|e| {
        HalError::unavailable(format!(
            "the Vulkan loader (libvulkan.so.1) could not be opened: {e} \
             (Debian: apt install libvulkan1 mesa-vulkan-drivers)"
        ))
    })
}

fn device_kind(t: vk::PhysicalDeviceType) -> (&'static str, u8) {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => ("discrete GPU", 0),
        vk::PhysicalDeviceType::INTEGRATED_GPU => ("integrated GPU", 1),
        vk::PhysicalDeviceType::VIRTUAL_GPU => ("virtual GPU", 2),
        vk::PhysicalDeviceType::CPU => ("CPU (software)", 3),
        _ => ("other", 4),
    }
}

/// The device index `FLINT_VK_DEVICE` selects, if set.
fn selected_index() -> Result<Option<usize>, HalError> {
    match std::env::var("FLINT_VK_DEVICE") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<usize>().map(Some).map_err(|_| {
            HalError::invalid(format!(
                "FLINT_VK_DEVICE={v:?} is not a device index (0, 1, ...)"
            ))
        }),
        _ => Ok(None),
    }
}

/// Whether `FLINT_VK_STAGING=1` asks for the staging path even on host-visible memory
/// (the path discrete GPUs take; lets it be tested on lavapipe).
fn force_staging() -> bool {
    matches!(
        std::env::var("FLINT_VK_STAGING").as_deref().map(str::trim),
        Ok("1" | "true" | "on" | "yes")
    )
}

/// Whether `FLINT_VK_F64=0` asks to run as a device without `shaderFloat64` would (the
/// shaders' `_f32` variants; lets them be tested on lavapipe, which has doubles).
fn no_float64() -> bool {
    matches!(
        std::env::var("FLINT_VK_F64").as_deref().map(str::trim),
        Ok("0" | "false" | "off" | "no")
    )
}

/// Checks that the loader opens and lists a device with a compute queue; returns the
/// adapter `open` would choose, without creating a device.
pub fn probe() -> Result<Adapter, HalError> {
    let entry = load_entry()?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_1);
    let ici = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a valid create info; destroyed below.
    let instance = unsafe { entry.create_instance(&ici, None) }.map_err(|e| {
        HalError::unavailable(format!("vk: no Vulkan instance could be created: {e}"))
    })?;
    let r = choose(&instance).map(|c| c.adapter);
    // SAFETY: nothing created from the instance is left.
    unsafe { instance.destroy_instance(None) };
    r
}

/// The physical device chosen, its queue family, memory types and limits.
struct Choice {
    pd: vk::PhysicalDevice,
    family: u32,
    storage_type: u32,
    storage_mapped: bool,
    host_type: u32,
    limits: Limits,
    adapter: Adapter,
}

impl Ctx {
    /// Creates instance and device on the chosen physical device (`FLINT_VK_DEVICE`, else
    /// the first discrete GPU, else integrated, else any).
    pub fn new() -> Result<Arc<Ctx>, HalError> {
        let entry = load_entry()?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"flint")
            .engine_name(c"flint")
            .api_version(vk::API_VERSION_1_1);
        let ici = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: a valid create info; the instance is destroyed in Drop (or below).
        let instance = unsafe { entry.create_instance(&ici, None) }.map_err(|e| {
            HalError::unavailable(format!("vk: no Vulkan instance could be created: {e}"))
        })?;
        match Self::with_instance(entry, instance.clone()) {
            Ok(c) => Ok(c),
            Err(e) => {
                // SAFETY: nothing created from the instance survives a failed setup.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    fn with_instance(entry: ash::Entry, instance: ash::Instance) -> Result<Arc<Ctx>, HalError> {
        let Choice {
            pd,
            family,
            storage_type,
            storage_mapped,
            host_type,
            limits,
            adapter,
        } = choose(&instance)?;
        let prio = [1.0f32];
        let qci = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&prio)];
        // Doubles where the device has them (`Limits::float64`).
        let features = vk::PhysicalDeviceFeatures::default().shader_float64(limits.float64);
        let dci = vk::DeviceCreateInfo::default()
            .queue_create_infos(&qci)
            .enabled_features(&features);
        // SAFETY: valid create info for a device of this instance.
        let dev = unsafe { instance.create_device(pd, &dci, None) }
            .map_err(|e| HalError::unavailable(format!("vk: vkCreateDevice failed: {e}")))?;
        // SAFETY: the family was created with one queue.
        let queue = unsafe { dev.get_device_queue(family, 0) };
        let ctx = Ctx {
            _entry: entry,
            instance,
            dev,
            queue,
            queue_family: family,
            storage_type,
            storage_mapped,
            host_type,
            limits,
            adapter,
            pipelines: Mutex::new(HashMap::new()),
        };
        Ok(Arc::new(ctx))
    }

    fn build_pipeline(&self, name: &str, spv: &[u8]) -> Result<Pipeline, HalError> {
        let words = ash::util::read_spv(&mut std::io::Cursor::new(spv))
            .map_err(|e| HalError::runtime(format!("vk: shader {name}: {e}")))?;
        let bindings = binding_count(&words);
        let b: Vec<_> = (0..bindings as u32)
            .map(|i| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(i)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let d = &self.dev;
        // SAFETY: valid create infos; every object is destroyed in Drop.
        unsafe {
            let set_layout = d
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&b),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
            let sl = [set_layout];
            let pcr = [vk::PushConstantRange {
                stage_flags: vk::ShaderStageFlags::COMPUTE,
                offset: 0,
                size: PUSH_BYTES,
            }];
            let layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default()
                        .set_layouts(&sl)
                        .push_constant_ranges(&pcr),
                    None,
                )
                .map_err(vk_err("vkCreatePipelineLayout"))?;
            let module = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .map_err(vk_err("vkCreateShaderModule"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let ci = [vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)];
            let r = d.create_compute_pipelines(vk::PipelineCache::null(), &ci, None);
            d.destroy_shader_module(module, None);
            let pipeline = r
                .map_err(|(_, e)| HalError::runtime(format!("vk: shader {name}: pipeline: {e}")))?
                [0];
            Ok(Pipeline {
                pipeline,
                layout,
                set_layout,
                bindings,
            })
        }
    }

    /// The pipeline of shader `name` (a name from `shaders/`; a missing one is a bug),
    /// built on first use; on a device without f64, its `_f32` variant where it has one.
    pub fn pipeline(&self, name: &str) -> Result<Pipeline, HalError> {
        let mut map = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(name) {
            return Ok(*p);
        }
        let find = |n: &str| SHADERS.iter().find(|(s, _)| *s == n);
        let &(key, base) = find(name).unwrap_or_else(|| panic!("vk: no shader named {name}"));
        // A device without shaderFloat64 runs the `_f32` variant where there is one; the
        // pipeline is kept under the shader's own name, so the choice is made once.
        let spv = match self.limits.float64 {
            true => base,
            false => find(&format!("{name}_f32")).map_or(base, |&(_, v)| v),
        };
        let p = self.build_pipeline(key, spv)?;
        map.insert(key, p);
        Ok(p)
    }

    /// Whether a shader named `name` exists.
    pub fn has_pipeline(&self, name: &str) -> bool {
        SHADERS.iter().any(|(n, _)| *n == name)
    }

    /// A buffer of `bytes` (rounded up to 16) in storage memory (`host == false`) or
    /// host-visible memory, mapped when host-visible.
    pub fn buffer(self: &Arc<Self>, bytes: u64, host: bool) -> Result<RawBuf, HalError> {
        let size = bytes.max(16).div_ceil(16) * 16;
        if !host && size > self.limits.max_range {
            return Err(HalError::out_of_memory(format!(
                "vk: a buffer of {size} bytes exceeds the device's largest storage binding \
                 ({} bytes)",
                self.limits.max_range
            )));
        }
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let d = &self.dev;
        // SAFETY: valid create infos; the buffer and memory are freed by RawBuf's Drop
        // (or here on failure).
        unsafe {
            let buffer = d
                .create_buffer(
                    &vk::BufferCreateInfo::default()
                        .size(size)
                        .usage(usage)
                        .sharing_mode(vk::SharingMode::EXCLUSIVE),
                    None,
                )
                .map_err(vk_err("vkCreateBuffer"))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let ty = if host {
                self.host_type
            } else {
                self.storage_type
            };
            if req.memory_type_bits & (1 << ty) == 0 {
                d.destroy_buffer(buffer, None);
                return Err(HalError::runtime(format!(
                    "vk: memory type {ty} not allowed for storage buffers"
                )));
            }
            let memory = match d.allocate_memory(
                &vk::MemoryAllocateInfo::default()
                    .allocation_size(req.size)
                    .memory_type_index(ty),
                None,
            ) {
                Ok(m) => m,
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    return Err(vk_err("vkAllocateMemory")(e));
                }
            };
            if let Err(e) = d.bind_buffer_memory(buffer, memory, 0) {
                d.destroy_buffer(buffer, None);
                d.free_memory(memory, None);
                return Err(vk_err("vkBindBufferMemory")(e));
            }
            let mapped = if host || self.storage_mapped {
                match d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) {
                    Ok(p) => Some(Mapped(p.cast::<u8>())),
                    Err(e) => {
                        d.destroy_buffer(buffer, None);
                        d.free_memory(memory, None);
                        return Err(vk_err("vkMapMemory")(e));
                    }
                }
            } else {
                None
            };
            Ok(RawBuf {
                ctx: self.clone(),
                buffer,
                memory,
                size,
                mapped,
            })
        }
    }
}

fn choose(instance: &ash::Instance) -> Result<Choice, HalError> {
    // SAFETY: a live instance.
    let pdevs = unsafe { instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    // Candidates: devices with a compute queue.
    let mut cands = Vec::new();
    for (i, &pd) in pdevs.iter().enumerate() {
        // SAFETY: `pd` comes from this instance.
        let (props, qfs) = unsafe {
            (
                instance.get_physical_device_properties(pd),
                instance.get_physical_device_queue_family_properties(pd),
            )
        };
        if let Some(f) = qfs
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
        {
            cands.push((i, pd, props, f as u32));
        }
    }
    if cands.is_empty() {
        return Err(HalError::unavailable(format!(
            "vk: no Vulkan device with a compute queue ({} devices; install a driver, \
                 e.g. Debian's mesa-vulkan-drivers for lavapipe)",
            pdevs.len()
        )));
    }
    let chosen = match selected_index()? {
        Some(i) => cands.iter().find(|c| c.0 == i).ok_or_else(|| {
            HalError::invalid(format!(
                "FLINT_VK_DEVICE={i}: no such Vulkan device with a compute queue \
                     ({} present)",
                pdevs.len()
            ))
        })?,
        None => cands
            .iter()
            .min_by_key(|c| device_kind(c.2.device_type).1)
            .expect("non-empty"),
    };
    let (_, pd, props, family) = *chosen;
    // SAFETY: `pd` comes from this instance.
    let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
    let mut sg = vk::PhysicalDeviceSubgroupProperties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut sg);
    // SAFETY: a 1.1 instance (every device it lists is 1.1 or later); the chain holds
    // one valid struct.
    unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
    let broadcast = sg.supported_stages.contains(vk::ShaderStageFlags::COMPUTE)
        && sg
            .supported_operations
            .contains(vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::BALLOT);
    let limits = Limits {
        max_range: u64::from(props.limits.max_storage_buffer_range),
        offset_align: props.limits.min_storage_buffer_offset_alignment.max(4),
        max_groups: props.limits.max_compute_work_group_count[0].min(65535),
        subgroup_broadcast: if broadcast { sg.subgroup_size } else { 0 },
        // SAFETY: `pd` comes from this instance.
        float64: unsafe { instance.get_physical_device_features(pd) }.shader_float64 != 0
            && !no_float64(),
    };
    if props.limits.max_push_constants_size < PUSH_BYTES {
        return Err(HalError::unavailable(format!(
            "vk: device offers {} bytes of push constants, {PUSH_BYTES} needed",
            props.limits.max_push_constants_size
        )));
    }
    let types = &mem.memory_types[..mem.memory_type_count as usize];
    let has = |i: usize, f: vk::MemoryPropertyFlags| types[i].property_flags.contains(f);
    let hv = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let dl = vk::MemoryPropertyFlags::DEVICE_LOCAL;
    let host_type = (0..types.len())
        .find(|&i| has(i, hv))
        .ok_or_else(|| HalError::unavailable("vk: no host-visible coherent memory type"))?;
    let unified = (0..types.len()).find(|&i| has(i, dl | hv));
    let (storage_type, storage_mapped) = match unified {
        Some(i) if !force_staging() => (i, true),
        _ => (
            (0..types.len()).find(|&i| has(i, dl)).unwrap_or(host_type),
            false,
        ),
    };
    let heap = types[storage_type].heap_index as usize;
    let memory_bytes = mem.memory_heaps[heap].size;
    let (kind, _) = device_kind(props.device_type);
    let api = (
        vk::api_version_major(props.api_version),
        vk::api_version_minor(props.api_version),
        vk::api_version_patch(props.api_version),
    );
    let mut driver = format!("driver {:#x}", props.driver_version);
    if api >= (1, 2, 0) {
        let mut drv = vk::PhysicalDeviceDriverProperties::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut drv);
        // SAFETY: a 1.2 device; the chain holds one valid struct.
        unsafe { instance.get_physical_device_properties2(pd, &mut p2) };
        driver = format!("{} {}", c_str(&drv.driver_name), c_str(&drv.driver_info));
    }
    let adapter = Adapter {
        name: c_str(&props.device_name),
        kind: kind.to_string(),
        driver,
        memory_bytes,
        api,
    };
    Ok(Choice {
        pd,
        family,
        storage_type: storage_type as u32,
        storage_mapped,
        host_type: host_type as u32,
        limits,
        adapter,
    })
}

/// The number of storage-buffer bindings a SPIR-V module declares in set 0: one more
/// than the largest `Binding` decoration (shaders number their bindings from 0).
fn binding_count(words: &[u32]) -> usize {
    const OP_DECORATE: u32 = 71;
    const DECORATION_BINDING: u32 = 33;
    let mut i = 5;
    let mut n = 0;
    while i < words.len() {
        let wc = (words[i] >> 16) as usize;
        let op = words[i] & 0xffff;
        if wc == 0 {
            break;
        }
        if op == OP_DECORATE && wc >= 4 && words[i + 2] == DECORATION_BINDING {
            n = n.max(words[i + 3] as usize + 1);
        }
        i += wc;
    }
    n
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: every buffer holds an `Arc<Ctx>`, so none is left; the queue is idle
        // (every submission is waited for).
        unsafe {
            let _ = self.dev.device_wait_idle();
            let map = self.pipelines.get_mut().unwrap_or_else(|e| e.into_inner());
            for p in map.values() {
                self.dev.destroy_pipeline(p.pipeline, None);
                self.dev.destroy_pipeline_layout(p.layout, None);
                self.dev.destroy_descriptor_set_layout(p.set_layout, None);
            }
            self.dev.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

/// A host pointer to mapped memory.
#[derive(Clone, Copy, Debug)]
pub struct Mapped(*mut u8);

// SAFETY: the pointer is to memory mapped for the life of its RawBuf; every access goes
// through RawBuf's methods, whose callers order them against queued GPU work (the batch
// lock).
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

/// A Vulkan buffer with its own memory, freed on drop.
#[derive(Debug)]
pub struct RawBuf {
    ctx: Arc<Ctx>,
    pub buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    /// Bytes allocated.
    pub size: u64,
    mapped: Option<Mapped>,
}

impl RawBuf {
    /// Whether the buffer is mapped (host-visible).
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Copies `src` into the mapped buffer at byte `offset`. The caller makes sure no
    /// queued GPU work touches these bytes.
    pub fn write(&self, offset: usize, src: &[u8]) {
        let m = self.mapped.expect("write to an unmapped buffer");
        assert!(
            offset + src.len() <= self.size as usize,
            "write past the buffer"
        );
        // SAFETY: the range lies inside the mapping (checked above); no GPU work uses it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), m.0.add(offset), src.len()) };
    }

    /// Copies bytes at `offset` of the mapped buffer into `dst`. The caller makes sure
    /// the GPU work that wrote them has finished.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        let m = self.mapped.expect("read from an unmapped buffer");
        assert!(
            offset + dst.len() <= self.size as usize,
            "read past the buffer"
        );
        // SAFETY: the range lies inside the mapping (checked above); the GPU is done.
        unsafe { std::ptr::copy_nonoverlapping(m.0.add(offset), dst.as_mut_ptr(), dst.len()) };
    }

    /// Sets bytes of the mapped buffer to zero.
    pub fn zero(&self, offset: usize, len: usize) {
        let m = self.mapped.expect("zero an unmapped buffer");
        assert!(offset + len <= self.size as usize, "zero past the buffer");
        // SAFETY: the range lies inside the mapping; no GPU work uses it.
        unsafe { std::ptr::write_bytes(m.0.add(offset), 0, len) };
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: the buffer is not in use: queued work holds an Arc of it until the
        // batch that uses it has completed.
        unsafe {
            if self.mapped.is_some() {
                self.ctx.dev.unmap_memory(self.memory);
            }
            self.ctx.dev.destroy_buffer(self.buffer, None);
            self.ctx.dev.free_memory(self.memory, None);
        }
    }
}
