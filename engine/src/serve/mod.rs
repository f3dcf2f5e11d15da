//! `flint serve`: an OpenAI-compatible HTTP server over the paged engine.
//!
//! One engine thread owns the [`LLMEngine`] and runs its step loop; HTTP handlers (axum
//! on tokio) talk to it through a command channel. Each request gets an unbounded
//! channel of events; when the client goes away the receiver is dropped, the engine
//! thread notices (`is_closed`) and aborts the request, which returns its KV blocks.
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both streaming with
//! SSE and `[DONE]`, or not), `GET /v1/models`, `GET /health`, `GET /metrics`
//! (Prometheus text).

mod api;
pub mod engine;
mod metrics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::kv::RequestId;
use crate::sched::{EngineError, LLMEngine, RequestOutput, RequestParams, StepModel};

pub use api::{router, ChatMessage, TextSide};
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

    /// Queues a request; resolves once the engine admitted or refused it.
    pub(crate) async fn submit(
        &self,
        prompt: Vec<u32>,
        params: RequestParams,
    ) -> Result<(RequestId, mpsc::UnboundedReceiver<Event>), SubmitError> {
        if self.queue_depth() >= self.config.max_queue {
            return Err(SubmitError::QueueFull(self.queue_depth()));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let (atx, arx) = oneshot::channel();
        self.commands
            .send(Command::Add {
                prompt,
                params,
                events: tx,
                admitted: atx,
            })
            .map_err(|_| SubmitError::EngineGone)?;
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
    QueueFull(usize),
    Refused(String),
    EngineGone,
}

/// Starts the engine thread over `engine`; returns the handle the HTTP side uses.
pub fn spawn_engine<M: StepModel + Send + 'static>(
    engine: LLMEngine<M>,
    config: ServerConfig,
) -> EngineHandle {
    let (ctx, crx) = std_mpsc::channel::<Command>();
    let waiting = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::default());
    {
        let kv = engine.scheduler().kv();
        let total: usize = (0..kv.num_groups()).map(|g| kv.num_blocks(g)).sum();
        metrics.kv_blocks_total.store(total, Ordering::Relaxed);
    }
    let handle = EngineHandle {
        commands: ctx,
        waiting: waiting.clone(),
        metrics: metrics.clone(),
        config: Arc::new(config),
    };
    std::thread::Builder::new()
        .name("flint-engine".into())
        .spawn(move || engine_loop(engine, crx, waiting, metrics))
        .map(|_| ())
        .unwrap_or_else(|e| tracing::error!("could not start the engine thread: {e}"));
    handle
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
    waiting: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
) {
    let mut tracked: HashMap<RequestId, Tracked> = HashMap::new();
    loop {
        let alive = if engine.has_unfinished() {
            // Busy: one device session until nothing is left to compute, so that the
            // steps start without a hand-off between threads; the blocking wait for
            // new requests happens outside it.
            engine.in_session(|engine| loop {
                if !serve_once(engine, &mut commands, &mut tracked, &waiting, &metrics) {
                    return false;
                }
                if !engine.has_unfinished() {
                    return true;
                }
            })
        } else {
            serve_once(&mut engine, &mut commands, &mut tracked, &waiting, &metrics)
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
    waiting: &AtomicUsize,
    metrics: &Metrics,
) -> bool {
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
                        }
                    }
                    Err(e) => {
                        metrics.requests_refused.fetch_add(1, Ordering::Relaxed);
                        let _ = admitted.send(Err(e));
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
    }

    if engine.has_unfinished() {
        let stepped = engine.step();
        // Published before the step's events go out, so that a client that has
        // seen a token also sees the blocks its request holds.
        publish(engine, waiting, metrics);
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
                    let closed = t.events.send(Event::Output(o)).is_err();
                    if finished {
                        tracked.remove(&id);
                        metrics.requests_finished.fetch_add(1, Ordering::Relaxed);
                    } else if closed {
                        engine.abort(id);
                        tracked.remove(&id);
                        metrics.requests_aborted.fetch_add(1, Ordering::Relaxed);
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
                }
            }
        }
    }

    publish(engine, waiting, metrics);
    true
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

/// Serves `router` on `addr` until the process is stopped (Ctrl-C ends it cleanly).
pub async fn serve(addr: SocketAddr, app: axum::Router) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, app).await
}

/// Serves `router` on an already bound listener (tests bind port 0).
pub async fn serve_on(listener: tokio::net::TcpListener, app: axum::Router) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}
