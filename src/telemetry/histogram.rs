//! sluice's histograms: counted into [`SECONDS_BUCKETS`] as each sample
//! is recorded, and rendered beside the Prometheus recorder's counters and
//! gauges, in its format.
//!
//! The recorder keeps a histogram's every sample (a lock-free list) until
//! upkeep or a scrape folds them into buckets: about 300 instructions a
//! sample between the two, and a forwarded request records one (the
//! upstream's time), a limited one two (its decision's too), a decision
//! on Redis three (the call's). Here a sample is a bucket found among the
//! bounds (most samples fall in the first few) and two atomic additions,
//! its count's and its sum's; nothing is kept or folded later.
//!
//! Every histogram is registered through [`histogram`], which hands back
//! a `metrics::Histogram` as the recorder would: the code that records is
//! the same. A name and label set registered again (a reload's routes)
//! gets the same series.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use metrics::{HistogramFn, Key, Label};
use metrics_exporter_prometheus::formatting;

use super::names::{Kind, ALL};

/// The upper bounds of every histogram's buckets, in seconds:
/// sub-millisecond resolution for decisions, up to a minute for slow
/// upstreams.
pub const SECONDS_BUCKETS: [f64; 19] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// One series: how many samples fell in each bucket (the last above every
/// bound; not cumulative: a sample adds to one), and their sum.
#[derive(Default)]
struct Buckets {
    counts: [AtomicU64; SECONDS_BUCKETS.len() + 1],
    /// In nanoseconds: an integer sum is one atomic addition, where a
    /// float's is a loop of compare-and-swap.
    sum_nanos: AtomicU64,
}

impl HistogramFn for Buckets {
    fn record(&self, seconds: f64) {
        // NaN is in no bucket but the last; a negative sample (never made:
        // durations) would count as nothing in the sum.
        let at = SECONDS_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(SECONDS_BUCKETS.len());
        self.counts[at].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }
}

/// A registered series: its metric's name, its labels as the recorder
/// writes them (`key="value"`, sanitized), and its buckets.
struct Series {
    name: String,
    labels: Vec<String>,
    buckets: Arc<Buckets>,
}

/// Every series, in the order registered, and where each is by name and
/// labels (a configuration of thousands of routes registers as many).
#[derive(Default)]
struct Registry {
    series: Vec<Series>,
    at: HashMap<(String, Vec<String>), usize>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

/// The histogram `name` with `labels`: the series registered before under
/// the same name and labels, or a new one at 0.
pub fn histogram(name: &'static str, labels: &[(&'static str, &str)]) -> metrics::Histogram {
    let key = Key::from_parts(
        name,
        labels
            .iter()
            .map(|&(key, value)| Label::new(key, value.to_owned()))
            .collect::<Vec<_>>(),
    );
    let (name, labels) = formatting::key_to_parts(&key, None);
    let mut registry = crate::sync::lock(&REGISTRY);
    let Registry { series, at } = &mut *registry;
    let at = *at.entry((name.clone(), labels.clone())).or_insert_with(|| {
        series.push(Series {
            name,
            labels,
            buckets: Arc::default(),
        });
        series.len() - 1
    });
    metrics::Histogram::from_arc(series[at].buckets.clone())
}

/// Appends every registered histogram to `out`, in the Prometheus text
/// format, as the recorder renders its own: per metric its help and type,
/// then per series the cumulative buckets, `+Inf`, the sum and the count.
/// A series' count is what its buckets add up to, read once, so `+Inf` and
/// `_count` always agree, however many samples arrive meanwhile.
pub fn render_into(out: &mut String) {
    let registry = crate::sync::lock(&REGISTRY);
    let series = &registry.series;
    for metric in ALL.iter().filter(|m| m.kind == Kind::Histogram) {
        let mut of_metric = series.iter().filter(|s| s.name == metric.name).peekable();
        if of_metric.peek().is_none() {
            continue;
        }
        formatting::write_help_line(out, metric.name, metric.help);
        formatting::write_type_line(out, metric.name, "histogram");
        for s in of_metric {
            let mut cumulative = 0;
            for (bound, count) in SECONDS_BUCKETS.iter().zip(&s.buckets.counts) {
                cumulative += count.load(Ordering::Relaxed);
                let le = Some(("le", bound));
                formatting::write_metric_line(
                    out,
                    &s.name,
                    Some("bucket"),
                    &s.labels,
                    le,
                    cumulative,
                    None,
                );
            }
            cumulative += s.buckets.counts[SECONDS_BUCKETS.len()].load(Ordering::Relaxed);
            let inf = Some(("le", "+Inf"));
            formatting::write_metric_line(
                out,
                &s.name,
                Some("bucket"),
                &s.labels,
                inf,
                cumulative,
                None,
            );
            let sum = s.buckets.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
            formatting::write_metric_line::<&str, f64>(
                out,
                &s.name,
                Some("sum"),
                &s.labels,
                None,
                sum,
                None,
            );
            formatting::write_metric_line::<&str, u64>(
                out,
                &s.name,
                Some("count"),
                &s.labels,
                None,
                cumulative,
                None,
            );
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series' samples of `text`: each line's value, by what follows the
    /// name.
    fn lines<'t>(text: &'t str, prefix: &str) -> Vec<(&'t str, &'t str)> {
        text.lines()
            .filter_map(|line| line.strip_prefix(prefix))
            .filter_map(|rest| rest.rsplit_once(' '))
            .collect()
    }

    #[test]
    fn samples_land_in_their_buckets_cumulatively_with_their_sum_and_count() {
        let name = crate::telemetry::DECISION_DURATION;
        let h = histogram(name, &[("store", "histogram-test"), ("source", "one")]);
        for seconds in [0.000_01, 0.000_05, 0.000_2, 0.003, 0.003, 61.0] {
            h.record(seconds);
        }
        let mut out = String::new();
        render_into(&mut out);
        let series = format!("{name}_bucket{{store=\"histogram-test\",source=\"one\",");
        let buckets = lines(&out, &series);
        assert_eq!(buckets.len(), SECONDS_BUCKETS.len() + 1, "{out}");
        let at = |le: &str| {
            buckets
                .iter()
                .find(|(l, _)| *l == format!("le=\"{le}\"}}"))
                .map(|(_, v)| *v)
        };
        // A sample on a bound is in that bound's bucket (`le`).
        assert_eq!(at("0.00005"), Some("2"));
        assert_eq!(at("0.0001"), Some("2"));
        assert_eq!(at("0.00025"), Some("3"));
        assert_eq!(at("0.0025"), Some("3"));
        assert_eq!(at("0.005"), Some("5"));
        assert_eq!(at("60"), Some("5"));
        assert_eq!(at("+Inf"), Some("6"));
        let one = "{store=\"histogram-test\",source=\"one\"}";
        let sum = lines(&out, &format!("{name}_sum{one}"));
        let sum: f64 = sum[0].1.parse().unwrap();
        assert!((sum - 61.00626).abs() < 1e-6, "{sum}");
        assert_eq!(lines(&out, &format!("{name}_count{one}")), [("", "6")]);
        assert_eq!(
            out.matches(&format!("# TYPE {name} histogram\n")).count(),
            1,
            "{out}"
        );
    }

    #[test]
    fn a_series_registered_again_is_the_same_series() {
        let name = crate::telemetry::UPSTREAM_DURATION;
        histogram(name, &[("route", "histogram-test-again")]).record(0.5);
        histogram(name, &[("route", "histogram-test-again")]).record(0.5);
        histogram(name, &[("route", "histogram-test-other")]).record(0.5);
        let mut out = String::new();
        render_into(&mut out);
        let count = |route: &str| lines(&out, &format!("{name}_count{{route=\"{route}\"}}"));
        assert_eq!(count("histogram-test-again"), [("", "2")]);
        assert_eq!(count("histogram-test-other"), [("", "1")]);
    }
}
