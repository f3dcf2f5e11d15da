//! `flint serve --kv-events ENDPOINT`: the prefix cache's changes, published for a
//! router that sends each request to the replica holding its prefix.
//!
//! The wire format is vLLM's KV events as `vllm-router` 0.1.17 reads them (its
//! `--kv-event-source WORKER_URL=ENDPOINT`, `kv_aware` policy): a ZeroMQ PUB socket sends
//! one three-frame message per batch, `[topic, seq, payload]`, where `topic` is empty,
//! `seq` is the batch's number as an 8-byte big-endian integer (0, 1, 2, ...: a gap tells
//! the subscriber it missed one) and `payload` is a MessagePack `KVEventBatch`:
//!
//! ```text
//! [ts: float64, events: [event, ...], data_parallel_rank: 0]
//! {"type": "BlockStored", "block_hashes": [u64, ...], "parent_block_hash": u64 | nil,
//!  "token_ids": [u32, ...], "block_size": 16, "lora_id": nil, "medium": "GPU",
//!  "lora_name": nil}
//! {"type": "BlockRemoved", "block_hashes": [u64, ...], "medium": "GPU"}
//! {"type": "AllBlocksCleared"}
//! ```
//!
//! A block hash is the last 8 bytes (big-endian) of the block's SHA-256 chain hash, as
//! vLLM sends its own by default; a router keys blocks by hash and matches prompts by
//! the token ids, so the hash function need not be vLLM's. `medium` is `"GPU"`, vLLM's
//! name for an engine's own KV pool, whatever the device. The events describe the first
//! KV-cache group ([`KvCacheManager::take_events`](crate::kv::KvCacheManager::take_events)).
//!
//! The engine thread hands each step's events to [`KvEventSink::send`] (a bounded queue:
//! it never waits); a task on the server's runtime encodes and publishes them. A batch
//! the queue cannot take is dropped and its number skipped, so subscribers see the gap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend};

use crate::kv::KvCacheEvent;

/// Batches waiting for the publisher before new ones are dropped.
const QUEUE: usize = 4096;

/// vLLM's `medium` for an engine's own KV pool.
const MEDIUM: &str = "GPU";

/// `--kv-events` could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    /// The endpoint is not `tcp://HOST:PORT`.
    #[error("--kv-events {endpoint}: {reason}")]
    BadEndpoint {
        /// The endpoint given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Binding the PUB socket failed.
    #[error("--kv-events {endpoint}: cannot bind: {reason}")]
    Bind {
        /// The endpoint given.
        endpoint: String,
        /// The socket's error.
        reason: String,
    },
}

/// One step's events, numbered.
#[derive(Debug)]
struct Batch {
    seq: u64,
    ts: f64,
    events: Vec<KvCacheEvent>,
}

/// The engine thread's end: numbers batches and queues them without waiting.
#[derive(Debug)]
pub struct KvEventSink {
    tx: mpsc::Sender<Batch>,
    next_seq: AtomicU64,
    dropped: AtomicU64,
}

impl KvEventSink {
    /// Queues `events` as the next batch (nothing when empty). When the queue is full
    /// the batch is dropped, its number skipped, and the drop counted.
    pub fn send(&self, events: Vec<KvCacheEvent>) {
        if events.is_empty() {
            return;
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        if self.tx.try_send(Batch { seq, ts, events }).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!("--kv-events: {n} event batches dropped (the publisher lags)");
            }
        }
    }

    /// Batches dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Binds a PUB socket on `endpoint` (`tcp://HOST:PORT`; `*` for HOST means every
/// interface; port 0 picks a free one) and starts the task that publishes what the
/// returned sink is given, on the current tokio runtime. Returns the sink and the
/// endpoint actually bound.
pub async fn bind(
    endpoint: &str,
    block_size: usize,
) -> Result<(KvEventSink, String), KvEventsError> {
    let addr = tcp_address(endpoint)?;
    let mut socket = zeromq::PubSocket::new();
    let bound = socket.bind(&addr).await.map_err(|e| KvEventsError::Bind {
        endpoint: endpoint.to_string(),
        reason: e.to_string(),
    })?;
    let (tx, mut rx) = mpsc::channel::<Batch>(QUEUE);
    tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            let payload = encode_batch(batch.ts, &batch.events, block_size);
            let frames = vec![
                bytes::Bytes::new(),
                bytes::Bytes::copy_from_slice(&batch.seq.to_be_bytes()),
                bytes::Bytes::from(payload),
            ];
            let Ok(msg) = zeromq::ZmqMessage::try_from(frames) else {
                continue;
            };
            if let Err(e) = socket.send(msg).await {
                tracing::warn!("--kv-events: publishing batch {} failed: {e}", batch.seq);
            }
        }
    });
    let sink = KvEventSink {
        tx,
        next_seq: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
    };
    Ok((sink, bound.to_string()))
}

/// `tcp://HOST:PORT` as the socket library wants it (`*` becomes `0.0.0.0`).
fn tcp_address(endpoint: &str) -> Result<String, KvEventsError> {
    let bad = |reason: &str| KvEventsError::BadEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let rest = endpoint
        .strip_prefix("tcp://")
        .ok_or_else(|| bad("only tcp://HOST:PORT endpoints are supported"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad("no port (tcp://HOST:PORT)"))?;
    port.parse::<u16>()
        .map_err(|e| bad(&format!("port '{port}': {e}")))?;
    if host.is_empty() {
        return Err(bad("no host (tcp://HOST:PORT; * for every interface)"));
    }
    let host = if host == "*" { "0.0.0.0" } else { host };
    Ok(format!("tcp://{host}:{port}"))
}

/// The MessagePack `KVEventBatch` of `events` (see the module docs), stamped `ts`
/// (seconds since the epoch).
pub fn encode_batch(ts: f64, events: &[KvCacheEvent], block_size: usize) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + 8 * events.len()));
    w.array(3);
    w.f64(ts);
    w.array(events.len());
    for e in events {
        match e {
            KvCacheEvent::Stored {
                hashes,
                parent,
                tokens,
            } => {
                w.map(8);
                w.str("type");
                w.str("BlockStored");
                w.str("block_hashes");
                w.array(hashes.len());
                for h in hashes {
                    w.uint(h.to_u64());
                }
                w.str("parent_block_hash");
                match parent {
                    Some(p) => w.uint(p.to_u64()),
                    None => w.nil(),
                }
                w.str("token_ids");
                w.array(tokens.len());
                for &t in tokens {
                    w.uint(u64::from(t));
                }
                w.str("block_size");
                w.uint(block_size as u64);
                w.str("lora_id");
                w.nil();
                w.str("medium");
                w.str(MEDIUM);
                w.str("lora_name");
                w.nil();
            }
            KvCacheEvent::Removed { hashes } => {
                w.map(3);
                w.str("type");
                w.str("BlockRemoved");
                w.str("block_hashes");
                w.array(hashes.len());
                for h in hashes {
                    w.uint(h.to_u64());
                }
                w.str("medium");
                w.str(MEDIUM);
            }
            KvCacheEvent::AllCleared => {
                w.map(1);
                w.str("type");
                w.str("AllBlocksCleared");
            }
        }
    }
    // data_parallel_rank: one engine per replica.
    w.uint(0);
    w.0
}

/// MessagePack into a vector (writes to memory cannot fail; the lengths written here
/// are far below the format's 2^32 limit).
struct Writer(Vec<u8>);

impl Writer {
    fn len32(n: usize) -> u32 {
        u32::try_from(n).unwrap_or(u32::MAX)
    }
    fn array(&mut self, n: usize) {
        let _ = rmp::encode::write_array_len(&mut self.0, Self::len32(n));
    }
    fn map(&mut self, n: usize) {
        let _ = rmp::encode::write_map_len(&mut self.0, Self::len32(n));
    }
    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(&mut self.0, s);
    }
    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(&mut self.0, v);
    }
    fn f64(&mut self, v: f64) {
        let _ = rmp::encode::write_f64(&mut self.0, v);
    }
    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(&mut self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::hash_block;
    use rmpv::Value;

    fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
        map.as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no field {key} in {map}"))
    }

    fn keys(map: &Value) -> Vec<&str> {
        map.as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_batch_decodes_as_vllm_kv_events() {
        let a = hash_block(None, &[1, 2, 3, 4], &[]);
        let b = hash_block(Some(&a), &[5, 6, 7, 8], &[]);
        let events = vec![
            KvCacheEvent::AllCleared,
            KvCacheEvent::Stored {
                hashes: vec![a, b],
                parent: None,
                tokens: vec![1, 2, 3, 4, 5, 6, 7, 8],
            },
            KvCacheEvent::Stored {
                hashes: vec![b],
                parent: Some(a),
                tokens: vec![70_000, 6, 7, 8],
            },
            KvCacheEvent::Removed { hashes: vec![b, a] },
        ];
        let bytes = encode_batch(1234.5, &events, 4);
        let v = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        let top = v.as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].as_f64(), Some(1234.5));
        assert_eq!(top[2].as_u64(), Some(0), "data_parallel_rank");
        let ev = top[1].as_array().unwrap();
        assert_eq!(ev.len(), 4);

        assert_eq!(keys(&ev[0]), ["type"]);
        assert_eq!(field(&ev[0], "type").as_str(), Some("AllBlocksCleared"));

        assert_eq!(
            keys(&ev[1]),
            [
                "type",
                "block_hashes",
                "parent_block_hash",
                "token_ids",
                "block_size",
                "lora_id",
                "medium",
                "lora_name"
            ]
        );
        assert_eq!(field(&ev[1], "type").as_str(), Some("BlockStored"));
        let hashes: Vec<u64> = field(&ev[1], "block_hashes")
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        assert_eq!(hashes, [a.to_u64(), b.to_u64()]);
        assert!(field(&ev[1], "parent_block_hash").is_nil());
        let tokens: Vec<u64> = field(&ev[1], "token_ids")
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(tokens, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(field(&ev[1], "block_size").as_u64(), Some(4));
        assert!(field(&ev[1], "lora_id").is_nil());
        assert!(field(&ev[1], "lora_name").is_nil());
        assert_eq!(field(&ev[1], "medium").as_str(), Some("GPU"));

        assert_eq!(
            field(&ev[2], "parent_block_hash").as_u64(),
            Some(a.to_u64())
        );
        assert_eq!(
            field(&ev[2], "token_ids").as_array().unwrap()[0].as_u64(),
            Some(70_000)
        );

        assert_eq!(keys(&ev[3]), ["type", "block_hashes", "medium"]);
        assert_eq!(field(&ev[3], "type").as_str(), Some("BlockRemoved"));
        let removed: Vec<u64> = field(&ev[3], "block_hashes")
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_u64().unwrap())
            .collect();
        assert_eq!(removed, [b.to_u64(), a.to_u64()]);
    }

    #[test]
    fn an_empty_batch_is_still_a_batch() {
        let bytes = encode_batch(0.0, &[], 16);
        let v = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        assert_eq!(v.as_array().unwrap()[1].as_array().unwrap().len(), 0);
    }

    #[test]
    fn endpoints_are_tcp_with_a_host_and_a_port() {
        assert_eq!(tcp_address("tcp://*:5557").unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(
            tcp_address("tcp://127.0.0.1:0").unwrap(),
            "tcp://127.0.0.1:0"
        );
        for bad in [
            "ipc:///tmp/x",
            "tcp://127.0.0.1",
            "tcp://:5557",
            "tcp://h:99999",
        ] {
            let e = tcp_address(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e} names the endpoint");
        }
    }

    /// Through a real socket: a subscriber gets `[topic, seq, payload]` frames, the
    /// numbers in order, the payloads decodable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscriber_receives_numbered_batches() {
        use zeromq::SocketRecv;
        let (sink, bound) = bind("tcp://127.0.0.1:0", 16).await.unwrap();
        assert!(bound.starts_with("tcp://127.0.0.1:"), "{bound}");
        let mut sub = zeromq::SubSocket::new();
        sub.connect(&bound).await.unwrap();
        sub.subscribe("").await.unwrap();
        // A PUB socket drops what it sends before the subscription arrives: send until
        // one batch gets through, then two more.
        let first = loop {
            sink.send(vec![KvCacheEvent::AllCleared]);
            match tokio::time::timeout(std::time::Duration::from_millis(100), sub.recv()).await {
                Ok(m) => break m.unwrap(),
                Err(_) => continue,
            }
        };
        let seq_of = |m: &zeromq::ZmqMessage| {
            let frames: Vec<Vec<u8>> = m.iter().map(|f| f.to_vec()).collect();
            assert_eq!(frames.len(), 3, "topic, seq, payload");
            assert!(frames[0].is_empty(), "the empty topic");
            let v = rmpv::decode::read_value(&mut frames[2].as_slice()).unwrap();
            assert_eq!(v.as_array().unwrap().len(), 3);
            u64::from_be_bytes(frames[1].as_slice().try_into().unwrap())
        };
        let s0 = seq_of(&first);
        let a = hash_block(None, &[1; 16], &[]);
        sink.send(vec![KvCacheEvent::Stored {
            hashes: vec![a],
            parent: None,
            tokens: vec![1; 16],
        }]);
        sink.send(vec![KvCacheEvent::Removed { hashes: vec![a] }]);
        let next: Vec<u64> = [sub.recv().await.unwrap(), sub.recv().await.unwrap()]
            .iter()
            .map(seq_of)
            .collect();
        assert_eq!(next, [s0 + 1, s0 + 2]);
        assert_eq!(sink.dropped(), 0);
    }

    #[test]
    fn a_full_queue_drops_the_batch_and_skips_its_number() {
        let (tx, mut rx) = mpsc::channel(1);
        let sink = KvEventSink {
            tx,
            next_seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        };
        sink.send(vec![]);
        sink.send(vec![KvCacheEvent::AllCleared]);
        sink.send(vec![KvCacheEvent::AllCleared]);
        assert_eq!(sink.dropped(), 1);
        assert_eq!(
            rx.try_recv().unwrap().seq,
            0,
            "an empty batch takes no number"
        );
        sink.send(vec![KvCacheEvent::AllCleared]);
        assert_eq!(
            rx.try_recv().unwrap().seq,
            2,
            "the dropped batch's number is skipped"
        );
    }
}
