//! `flint serve`: the OpenAI-compatible server (see `docs/serving.md`).

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Args;
use flint_loader::chat::ChatTemplate;
use flint_loader::gguf::GgufFile;

use super::CliError;
use crate::model::load_on_device;
use crate::serve::{build_engine, EngineSettings, ModelText, DEFAULT_KV_MEMORY};

/// Arguments of `flint serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Model.
    #[command(flatten)]
    pub model: super::ModelArg,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one and prints it).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Device backend [default: $FLINT_DEVICE, else cpu].
    #[arg(long)]
    pub device: Option<String>,
    /// Most sequences batched in one step.
    #[arg(long, default_value_t = 16)]
    pub max_num_seqs: usize,
    /// Token budget of one step (prompt chunks and decodes together).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Longest sequence a request may reach [default: the model's context length].
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Bytes of KV cache [default: 1 GiB].
    #[arg(long)]
    pub kv_memory: Option<u64>,
    /// Requests allowed to wait before new ones get 503.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Name clients use for the model [default: the file name without .gguf].
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Compute every prompt in full instead of reusing the KV blocks of a prefix that
    /// earlier requests computed.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Every endpoint but /health wants `Authorization: Bearer KEY`.
    #[arg(long, env = "FLINT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Publish the prefix cache's changes (blocks stored and evicted) on this ZeroMQ
    /// endpoint, `tcp://HOST:PORT` (`*`: every interface), in vLLM's KV event format, for
    /// a router's KV-aware routing (`vllm-router --policy kv_aware --kv-event-source
    /// URL=ENDPOINT`; see docs/deploy.md). Flint binds it; the router connects.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
}

/// Runs `flint serve` until SIGTERM or SIGINT (Ctrl-C): the first stops admitting and
/// lets the requests in flight finish, a second exits at once.
pub fn run(args: &ServeArgs) -> Result<(), CliError> {
    if args.max_num_seqs == 0 || args.max_num_batched_tokens == 0 {
        return Err(CliError::new(
            "--max-num-seqs and --max-num-batched-tokens must be at least 1",
        ));
    }
    let path = crate::cli::model_path::resolve(&args.model)?;
    let loaded = load_on_device(&path, args.device.as_deref(), true)?;
    let settings = EngineSettings {
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_model_len: args.max_model_len,
        kv_memory: args.kv_memory.unwrap_or(DEFAULT_KV_MEMORY),
        prefix_caching: !args.no_prefix_cache,
        // Part of being warm before reporting healthy: no request pays the first touch
        // of the KV pool's pages.
        resident_kv: true,
        ..EngineSettings::default()
    };
    let file =
        GgufFile::open(&path).map_err(|e| CliError::new(format!("{}: {e}", path.display())))?;
    let (engine, tokenizer, max_model_len) = build_engine(loaded, &settings)?;
    let template = ChatTemplate::from_gguf(&file, &tokenizer).map_err(|e| e.to_string());
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "flint".into())
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::new(format!("starting the async runtime: {e}")))?;
    let kv_events = match &args.kv_events {
        Some(endpoint) => {
            if !engine.scheduler().kv().prefix_caching() {
                return Err(CliError::new(format!(
                    "--kv-events {endpoint}: the prefix cache is off (--no-prefix-cache, or \
                     a model whose cache cannot be shared), so there is nothing to publish"
                )));
            }
            let block_size = engine.scheduler().kv().block_size();
            let (sink, bound) = rt
                .block_on(crate::serve::kv_events::bind(endpoint, block_size))
                .map_err(|e| CliError::new(e.to_string()))?;
            eprintln!("flint serve: KV events on {bound} (block size {block_size})");
            Some(sink)
        }
        None => None,
    };
    let handle = crate::serve::spawn_engine_with_events(
        engine,
        crate::serve::ServerConfig {
            model_name: name.clone(),
            max_model_len,
            max_queue: args.max_queue,
            api_key: args.api_key.clone().map(crate::serve::ApiKey),
        },
        kv_events,
    );
    let app = crate::serve::router(
        handle.clone(),
        Arc::new(ModelText::new(tokenizer, template)),
    );
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .map_err(|e| CliError::new(format!("--host {} --port {}: {e}", args.host, args.port)))?;
    if args.api_key.as_deref() == Some("") {
        return Err(CliError::new(
            "--api-key (or FLINT_API_KEY) must not be empty",
        ));
    }
    if args.api_key.is_none() && !addr.ip().is_loopback() {
        eprintln!(
            "flint serve: warning: listening on {} without an API key: anyone who can reach \
             it can use it (set --api-key or FLINT_API_KEY)",
            addr.ip()
        );
    }
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| CliError::new(format!("cannot listen on {addr}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| CliError::new(format!("cannot listen on {addr}: {e}")))?;
        eprintln!("flint serve: model '{name}' on http://{local} (max_model_len {max_model_len})");
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        let drain_handle = handle.clone();
        tokio::spawn(async move {
            stop_signal().await;
            eprintln!(
                "flint serve: draining: {} requests in flight; new ones get 503 (a second \
                 signal exits at once)",
                drain_handle.in_flight()
            );
            let _ = first_tx.send(());
            stop_signal().await;
            eprintln!("flint serve: second signal: exiting now");
            std::process::exit(130);
        });
        let drained = async move {
            let _ = first_rx.await;
        };
        let r = crate::serve::serve_on(listener, app, handle, drained)
            .await
            .map_err(|e| CliError::new(format!("server on {local} failed: {e}")));
        eprintln!("flint serve: drained; exiting");
        r
    })
}

/// Resolves at the next SIGTERM or SIGINT (Ctrl-C elsewhere than on Unix).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
