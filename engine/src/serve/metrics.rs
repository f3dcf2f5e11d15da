//! Server metrics in Prometheus text format.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bucket upper bounds (seconds) of the latency histograms.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A fixed-bucket latency histogram (cumulative on output, as Prometheus wants).
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; 12],
    over: AtomicU64,
    /// Sum in microseconds (integer, so it can be atomic).
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation in seconds.
    pub fn observe(&self, seconds: f64) {
        match BUCKETS.iter().position(|&b| seconds <= b) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_us
            .fetch_add((seconds * 1e6).max(0.0) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut acc = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            acc += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        acc += self.over.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {acc}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {acc}");
    }
}

/// Counters, gauges and histograms of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests admitted.
    pub requests_total: AtomicU64,
    /// Requests answered with an error status before or at admission (bad input, a
    /// missing key, too long, queue full, draining): every 4xx and 503 response.
    pub requests_refused: AtomicU64,
    /// Preemptions (a running request's blocks taken back; it is computed again).
    pub preemptions: AtomicU64,
    /// Requests that finished normally.
    pub requests_finished: AtomicU64,
    /// Requests aborted (client went away).
    pub requests_aborted: AtomicU64,
    /// Prompt tokens admitted.
    pub prompt_tokens_total: AtomicU64,
    /// Tokens generated.
    pub generation_tokens_total: AtomicU64,
    /// Requests waiting (gauge).
    pub waiting: AtomicUsize,
    /// Requests running (gauge).
    pub running: AtomicUsize,
    /// KV blocks in use over all groups (gauge).
    pub kv_blocks_in_use: AtomicUsize,
    /// KV blocks over all groups.
    pub kv_blocks_total: AtomicUsize,
    /// Prompt tokens looked up in the prefix cache (the KV cache manager's count).
    pub prefix_cache_queries: AtomicU64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: AtomicU64,
    /// KV blocks findable in the prefix cache over all groups (gauge).
    pub prefix_cache_blocks: AtomicUsize,
    /// KV event batches dropped because the publisher lagged (`--kv-events`).
    pub kv_event_batches_dropped: AtomicU64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Time per output token after the first.
    pub tpot: Histogram,
}

impl Metrics {
    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let gauge = |s: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let ratio = |s: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        counter(
            &mut s,
            "flint_requests_total",
            "Requests admitted.",
            l(&self.requests_total),
        );
        counter(
            &mut s,
            "flint_requests_refused_total",
            "Requests answered with a 4xx or 503 status.",
            l(&self.requests_refused),
        );
        counter(
            &mut s,
            "flint_preemptions_total",
            "Running requests preempted (their KV blocks taken back, computed again later).",
            l(&self.preemptions),
        );
        counter(
            &mut s,
            "flint_requests_finished_total",
            "Requests finished.",
            l(&self.requests_finished),
        );
        counter(
            &mut s,
            "flint_requests_aborted_total",
            "Requests aborted because the client went away.",
            l(&self.requests_aborted),
        );
        counter(
            &mut s,
            "flint_prompt_tokens_total",
            "Prompt tokens admitted.",
            l(&self.prompt_tokens_total),
        );
        counter(
            &mut s,
            "flint_generation_tokens_total",
            "Tokens generated.",
            l(&self.generation_tokens_total),
        );
        // The gauges a router or an autoscaler reads, each also under vLLM's name.
        for name in ["flint_queue_depth", "vllm:num_requests_waiting"] {
            gauge(&mut s, name, "Requests waiting.", g(&self.waiting));
        }
        for name in ["flint_running_requests", "vllm:num_requests_running"] {
            gauge(&mut s, name, "Requests running.", g(&self.running));
        }
        let (in_use, total) = (g(&self.kv_blocks_in_use), g(&self.kv_blocks_total));
        gauge(
            &mut s,
            "flint_kv_blocks_in_use",
            "KV cache blocks in use.",
            in_use,
        );
        gauge(
            &mut s,
            "flint_kv_blocks_total",
            "KV cache blocks in all pools.",
            total,
        );
        let usage = if total == 0 {
            0.0
        } else {
            in_use as f64 / total as f64
        };
        for name in ["flint_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc"] {
            ratio(
                &mut s,
                name,
                "Fraction of the KV cache blocks in use, 0 to 1 (cached blocks no request \
                 holds count as free).",
                usage,
            );
        }
        let (queries, hits) = (l(&self.prefix_cache_queries), l(&self.prefix_cache_hits));
        // Each under its own name and under vLLM's (both in tokens).
        for name in [
            "flint_prefix_cache_queries_total",
            "vllm:prefix_cache_queries_total",
        ] {
            counter(
                &mut s,
                name,
                "Prompt tokens looked up in the prefix cache.",
                queries,
            );
        }
        for name in [
            "flint_prefix_cache_hits_total",
            "vllm:prefix_cache_hits_total",
        ] {
            counter(
                &mut s,
                name,
                "Prompt tokens found in the prefix cache.",
                hits,
            );
        }
        gauge(
            &mut s,
            "flint_prefix_cache_blocks",
            "KV cache blocks findable in the prefix cache.",
            g(&self.prefix_cache_blocks),
        );
        counter(
            &mut s,
            "flint_kv_event_batches_dropped_total",
            "KV event batches (--kv-events) dropped because the publisher lagged.",
            l(&self.kv_event_batches_dropped),
        );
        self.ttft
            .render(&mut s, "flint_ttft_seconds", "Time to first token.");
        self.tpot.render(
            &mut s,
            "flint_tpot_seconds",
            "Time per output token after the first.",
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the unlabelled sample `name` and its TYPE line's kind.
    fn sample(text: &str, name: &str) -> (String, String) {
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
            .unwrap_or_else(|| panic!("no TYPE line for {name}"));
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no sample of {name}"));
        (kind.to_string(), value.to_string())
    }

    #[test]
    fn router_and_autoscaler_gauges_are_there_under_both_names() {
        let m = Metrics::default();
        m.waiting.store(3, Ordering::Relaxed);
        m.running.store(5, Ordering::Relaxed);
        m.kv_blocks_in_use.store(25, Ordering::Relaxed);
        m.kv_blocks_total.store(100, Ordering::Relaxed);
        m.prefix_cache_queries.store(40, Ordering::Relaxed);
        m.prefix_cache_hits.store(30, Ordering::Relaxed);
        let t = m.render();
        let g = |v: &str| ("gauge".to_string(), v.to_string());
        let c = |v: &str| ("counter".to_string(), v.to_string());
        assert_eq!(sample(&t, "flint_queue_depth"), g("3"));
        assert_eq!(sample(&t, "vllm:num_requests_waiting"), g("3"));
        assert_eq!(sample(&t, "flint_running_requests"), g("5"));
        assert_eq!(sample(&t, "vllm:num_requests_running"), g("5"));
        assert_eq!(sample(&t, "flint_kv_cache_usage_ratio"), g("0.25"));
        assert_eq!(sample(&t, "vllm:kv_cache_usage_perc"), g("0.25"));
        assert_eq!(sample(&t, "flint_prefix_cache_queries_total"), c("40"));
        assert_eq!(sample(&t, "vllm:prefix_cache_queries_total"), c("40"));
        assert_eq!(sample(&t, "flint_prefix_cache_hits_total"), c("30"));
        assert_eq!(sample(&t, "vllm:prefix_cache_hits_total"), c("30"));
        assert_eq!(sample(&t, "flint_kv_event_batches_dropped_total"), c("0"));
        // An empty pool is 0 % used, not NaN.
        assert_eq!(
            sample(&Metrics::default().render(), "vllm:kv_cache_usage_perc"),
            g("0")
        );
    }
}
