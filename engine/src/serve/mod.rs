//! `flint serve`: an OpenAI-compatible HTTP server over the paged engine.
//!
//! One engine thread owns the [`LLMEngine`] and runs its step loop; HTTP handlers (axum
//! on tokio) talk to it through a command channel. Each request gets an unbounded
//! channel of events; when the client goes away the receiver is dropped, the engine
//! thread notices (`is_closed`) and aborts the request, which returns its KV blocks.
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both streaming with
//! SSE and `[DONE]`, or not), `POST /tokenize`, `POST /detokenize`, `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text).
//!
//! Life cycle ([`Phase`]): the engine thread first runs one small warm-up request
//! (`/health` answers 503 meanwhile), then serves; [`EngineHandle::drain`] stops
//! admitting (503 with `Retry-After`) while the requests in flight finish, and
//! [`serve_on`] returns once none is left.
//!
//! With a [`kv_events::KvEventSink`] ([`spawn_engine_with_events`]), the engine thread
//! hands the prefix cache's changes to it after every step (`flint serve --kv-events`).

mod api;
pub mod engine;
pub mod harmony;
pub mod kv_events;
mod metrics;
pub mod tools;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::kv::RequestId;
use crate::sample::{SamplerConfig, StopConditions};
use crate::sched::{EngineError, LLMEngine, RequestOutput, RequestParams, StepModel};

pub use api::{router, ChatMessage, ChatPrompt, TemplateVars, TextSide};
pub use engine::*;
pub use metrics::Metrics;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The model name clients must use (or omit) in requests.
    pub model_name: String,
    /// Longest sequence a request may reach.
    pub max_model_len: usize,
    /// Requests waiting beyond this are refused with 503.
    pub max_queue: usize,
    /// When set, every endpoint but `/health` wants `Authorization: Bearer KEY`.
    pub api_key: Option<ApiKey>,
}

/// The key clients must present; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// True when `given` is the key. The time taken depends on the lengths only, not on
    /// where the first differing byte is.
    pub fn matches(&self, given: &[u8]) -> bool {
        let key = self.0.as_bytes();
        let mut diff = u8::from(key.len() != given.len());
        for (i, &k) in key.iter().enumerate() {
            diff |= k ^ given.get(i).copied().unwrap_or(!k);
        }
        std::hint::black_box(diff) == 0
    }
}

/// Where the server is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The warm-up request is running; `/health` answers 503.
    WarmingUp,
    /// Serving.
    Ready,
    /// The warm-up request failed: the engine cannot compute; `/health` answers 503.
    Failed,
    /// Finishing the requests in flight; new ones get 503 with `Retry-After`.
    Draining,
}

impl Phase {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::WarmingUp,
            1 => Self::Ready,
            2 => Self::Failed,
            _ => Self::Draining,
        }
    }
}

/// What the engine thread sends to one request's handler.
#[derive(Debug)]
pub(crate) enum Event {
    /// One step's output.
    Output(RequestOutput),
    /// The engine failed; the request is over.
    Failed(String),
}

/// Commands to the engine thread.
pub(crate) enum Command {
    Add {
        prompt: Vec<u32>,
        params: RequestParams,
        events: mpsc::UnboundedSender<Event>,
        admitted: oneshot::Sender<Result<RequestId, EngineError>>,
    },
}

/// A handle on the engine thread, shared by the handlers.
#[derive(Clone)]
pub struct EngineHandle {
    commands: std_mpsc::Sender<Command>,
    waiting: Arc<AtomicUsize>,
    /// Requests submitted and not yet over (finished, aborted or refused).
    in_flight: Arc<AtomicUsize>,
    phase: Arc<AtomicU8>,
    /// Length of a row of logits: valid token ids are below it.
    pub vocab_size: usize,
    /// Server-wide counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub config: Arc<ServerConfig>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Requests queued on the engine thread and not yet running.
    pub fn queue_depth(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Where the server is in its life.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    /// Requests submitted and not yet over.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Stops admitting requests: from now on they get 503 with `Retry-After`; the ones
    /// in flight go on.
    pub fn drain(&self) {
        self.phase.store(Phase::Draining as u8, Ordering::Release);
    }

    /// Resolves once no request is in flight.
    pub async fn idle(&self) {
        while self.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Queues a request; resolves once the engine admitted or refused it.
    pub(crate) async fn submit(
        &self,
        prompt: Vec<u32>,
        params: RequestParams,
    ) -> Result<(RequestId, mpsc::UnboundedReceiver<Event>), SubmitError> {
        if self.phase() == Phase::Draining {
            return Err(SubmitError::Draining);
        }
        if self.queue_depth() >= self.config.max_queue {
            return Err(SubmitError::QueueFull(self.queue_depth()));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (atx, arx) = oneshot::channel();
        // Counted before it is sent; the engine thread uncounts it when it is over.
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if self
            .commands
            .send(Command::Add {
                prompt,
                params,
                events: tx,
                admitted: atx,
            })
            .is_err()
        {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::EngineGone);
        }
        match arx.await {
            Ok(Ok(id)) => Ok((id, rx)),
            Ok(Err(e)) => Err(SubmitError::Refused(e.to_string())),
            Err(_) => Err(SubmitError::EngineGone),
        }
    }
}

/// Why a request could not be queued.
#[derive(Debug)]
pub(crate) enum SubmitError {
    Draining,
    QueueFull(usize),
    Refused(String),
    EngineGone,
}

/// Starts the engine thread over `engine`; returns the handle the HTTP side uses. The
/// thread runs one warm-up request ([`warm_up`]) before it takes any other.
pub fn spawn_engine<M: StepModel + Send + 'static>(
    engine: LLMEngine<M>,
    config: ServerConfig,
) -> EngineHandle {
    spawn_engine_with_events(engine, config, None)
}

/// [`spawn_engine`], and when `kv_events` is given, the prefix cache's changes go to it
/// after every step (the first batch clears whatever a subscriber knew of this engine).
pub fn spawn_engine_with_events<M: StepModel + Send + 'static>(
    mut engine: LLMEngine<M>,
    config: ServerConfig,
    kv_events: Option<kv_events::KvEventSink>,
) -> EngineHandle {
    if kv_events.is_some() {
        engine.scheduler_mut().kv_mut().set_event_log(true);
    }
    let (ctx, crx) = std_mpsc::channel::<Command>();
    let waiting = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let phase = Arc::new(AtomicU8::new(Phase::WarmingUp as u8));
    let metrics = Arc::new(Metrics::default());
    let max_model_len = config.max_model_len;
    {
        let kv = engine.scheduler().kv();
        let total: usize = (0..kv.num_groups()).map(|g| kv.num_blocks(g)).sum();
        metrics.kv_blocks_total.store(total, Ordering::Relaxed);
    }
    let handle = EngineHandle {
        commands: ctx,
        waiting: waiting.clone(),
        in_flight: in_flight.clone(),
        phase: phase.clone(),
        vocab_size: engine.model().vocab_size(),
        metrics: metrics.clone(),
        config: Arc::new(config),
    };
    std::thread::Builder::new()
        .name("flint-engine".into())
        .spawn(move || {
            let outcome = match warm_up(&mut engine, max_model_len) {
                Ok(()) => Phase::Ready,
                Err(e) => {
                    tracing::error!("the warm-up request failed: {e}");
                    Phase::Failed
                }
            };
            // A drain that began meanwhile stays a drain.
            let _ = phase.compare_exchange(
                Phase::WarmingUp as u8,
                outcome as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            let ctx = LoopCtx {
                waiting,
                in_flight,
                metrics,
                kv_events,
            };
            engine_loop(engine, crx, &ctx)
        })
        .map(|_| ())
        .unwrap_or_else(|e| tracing::error!("could not start the engine thread: {e}"));
    handle
}

/// Runs one small request (a 16-token prompt, 4 greedy tokens) through `engine` to the
/// end, so that the first client's request does not pay for first-use costs (page
/// faults on the weights, buffers the first batches allocate). It leaves the prefix cache
/// empty and its counters at zero.
pub fn warm_up<M: StepModel + Send>(
    engine: &mut LLMEngine<M>,
    max_model_len: usize,
) -> Result<(), EngineError> {
    let vocab = u32::try_from(engine.model().vocab_size().max(1)).unwrap_or(u32::MAX);
    let len = 16.min(max_model_len.saturating_sub(4)).max(1);
    let prompt: Vec<u32> = (0..len as u32).map(|i| (i + 1) % vocab).collect();
    let params = RequestParams {
        sampler: SamplerConfig::greedy(),
        max_tokens: 4,
        stop: StopConditions::default(),
    };
    engine.add_request(prompt, params)?;
    engine.in_session(|e| {
        while e.has_unfinished() {
            e.step()?;
        }
        Ok::<(), EngineError>(())
    })?;
    // The warm-up's prompt is no client's: its blocks and counts leave the prefix cache.
    engine.scheduler_mut().kv_mut().reset_prefix_cache();
    Ok(())
}

/// What the engine loop shares with the handlers.
struct LoopCtx {
    waiting: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    kv_events: Option<kv_events::KvEventSink>,
}

impl LoopCtx {
    /// One request is over.
    fn over(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Tracked {
    events: mpsc::UnboundedSender<Event>,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

fn engine_loop<M: StepModel + Send>(
    mut engine: LLMEngine<M>,
    mut commands: std_mpsc::Receiver<Command>,
    ctx: &LoopCtx,
) {
    let mut tracked: HashMap<RequestId, Tracked> = HashMap::new();
    loop {
        let alive = if engine.has_unfinished() {
            // Busy: one device session until nothing is left to compute, so that the
            // steps start without a hand-off between threads; the blocking wait for
            // new requests happens outside it.
            engine.in_session(|engine| loop {
                if !serve_once(engine, &mut commands, &mut tracked, ctx) {
                    return false;
                }
                if !engine.has_unfinished() {
                    return true;
                }
            })
        } else {
            serve_once(&mut engine, &mut commands, &mut tracked, ctx)
        };
        if !alive {
            return;
        }
    }
}

/// One turn of the engine loop: takes the pending commands (waiting for one only when
/// nothing is left to compute), aborts the requests whose clients went away, runs a
/// step and sends its outputs. False once the server side hung up.
fn serve_once<M: StepModel>(
    engine: &mut LLMEngine<M>,
    commands: &mut std_mpsc::Receiver<Command>,
    tracked: &mut HashMap<RequestId, Tracked>,
    ctx: &LoopCtx,
) -> bool {
    let (waiting, metrics) = (&*ctx.waiting, &*ctx.metrics);
    // Take every pending command; block only when there is nothing to compute.
    let first = if engine.has_unfinished() {
        match commands.try_recv() {
            Ok(c) => Some(c),
            Err(std_mpsc::TryRecvError::Empty) => None,
            Err(std_mpsc::TryRecvError::Disconnected) => return false,
        }
    } else {
        match commands.recv_timeout(Duration::from_millis(200)) {
            Ok(c) => Some(c),
            Err(std_mpsc::RecvTimeoutError::Timeout) => None,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return false,
        }
    };
    let mut next = first;
    while let Some(cmd) = next {
        match cmd {
            Command::Add {
                prompt,
                params,
                events,
                admitted,
            } => {
                let n_prompt = prompt.len();
                match engine.add_request(prompt, params) {
                    Ok(id) => {
                        metrics.requests_total.fetch_add(1, Ordering::Relaxed);
                        metrics
                            .prompt_tokens_total
                            .fetch_add(n_prompt as u64, Ordering::Relaxed);
                        tracked.insert(
                            id,
                            Tracked {
                                events,
                                arrived: Instant::now(),
                                first_token: None,
                                last_token: None,
                            },
                        );
                        if admitted.send(Ok(id)).is_err() {
                            engine.abort(id);
                            tracked.remove(&id);
                            ctx.over();
                        }
                    }
                    Err(e) => {
                        // Counted as refused by the HTTP layer, with its 400.
                        let _ = admitted.send(Err(e));
                        ctx.over();
                    }
                }
            }
        }
        next = commands.try_recv().ok();
    }

    // Clients that went away: abort, which returns their blocks.
    let gone: Vec<RequestId> = tracked
        .iter()
        .filter(|(_, t)| t.events.is_closed())
        .map(|(&id, _)| id)
        .collect();
    for id in gone {
        engine.abort(id);
        tracked.remove(&id);
        metrics.requests_aborted.fetch_add(1, Ordering::Relaxed);
        ctx.over();
    }

    if engine.has_unfinished() {
        let stepped = engine.step();
        // Published before the step's events go out, so that a client that has
        // seen a token also sees the blocks its request holds.
        publish(engine, waiting, metrics);
        send_kv_events(engine, ctx);
        match stepped {
            Ok(outputs) => {
                let now = Instant::now();
                for o in outputs {
                    let id = o.id;
                    let finished = o.finished.is_some();
                    let Some(t) = tracked.get_mut(&id) else {
                        continue;
                    };
                    if o.token.is_some() {
                        metrics
                            .generation_tokens_total
                            .fetch_add(1, Ordering::Relaxed);
                        match t.last_token {
                            None => metrics.ttft.observe((now - t.arrived).as_secs_f64()),
                            Some(prev) => metrics.tpot.observe((now - prev).as_secs_f64()),
                        }
                        t.first_token.get_or_insert(now);
                        t.last_token = Some(now);
                    }
                    if finished {
                        // Counted before the last event goes out: a client that has its
                        // whole answer finds it counted.
                        metrics.requests_finished.fetch_add(1, Ordering::Relaxed);
                    }
                    let closed = t.events.send(Event::Output(o)).is_err();
                    if finished {
                        tracked.remove(&id);
                        ctx.over();
                    } else if closed {
                        engine.abort(id);
                        tracked.remove(&id);
                        metrics.requests_aborted.fetch_add(1, Ordering::Relaxed);
                        ctx.over();
                    }
                }
            }
            Err(e) => {
                // A failed step fails every request in flight; nothing is left
                // holding blocks.
                let msg = e.to_string();
                tracing::error!("engine step failed: {msg}");
                for (id, t) in tracked.drain() {
                    let _ = t.events.send(Event::Failed(msg.clone()));
                    engine.abort(id);
                    ctx.over();
                }
            }
        }
    }

    publish(engine, waiting, metrics);
    send_kv_events(engine, ctx);
    true
}

/// Hands the prefix cache's changes since the last call to the KV event sink, if any.
fn send_kv_events<M: StepModel>(engine: &mut LLMEngine<M>, ctx: &LoopCtx) {
    if let Some(sink) = &ctx.kv_events {
        sink.send(engine.scheduler_mut().kv_mut().take_events());
        ctx.metrics
            .kv_event_batches_dropped
            .store(sink.dropped(), Ordering::Relaxed);
    }
}

/// Stores the scheduler's queue lengths and the KV blocks in use in the metrics.
fn publish<M: StepModel>(engine: &LLMEngine<M>, waiting: &AtomicUsize, metrics: &Metrics) {
    let s = engine.scheduler();
    waiting.store(s.num_waiting(), Ordering::Relaxed);
    metrics.waiting.store(s.num_waiting(), Ordering::Relaxed);
    metrics.running.store(s.num_running(), Ordering::Relaxed);
    let kv = s.kv();
    let used: usize = (0..kv.num_groups())
        .map(|g| kv.num_blocks(g) - kv.num_free(g))
        .sum();
    metrics.kv_blocks_in_use.store(used, Ordering::Relaxed);
    metrics
        .preemptions
        .store(s.num_preemptions(), Ordering::Relaxed);
    let prefix = kv.prefix_cache_stats();
    metrics
        .prefix_cache_queries
        .store(prefix.queries, Ordering::Relaxed);
    metrics
        .prefix_cache_hits
        .store(prefix.hits, Ordering::Relaxed);
    metrics
        .prefix_cache_blocks
        .store(prefix.cached_blocks, Ordering::Relaxed);
}

/// Serves `app` on an already bound listener (tests bind port 0) until `shutdown`
/// resolves; then drains: new requests get 503 with `Retry-After`, the ones in flight
/// finish and their responses go out, and it returns.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    handle: EngineHandle,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            handle.drain();
            handle.idle().await;
        })
        .await
}
