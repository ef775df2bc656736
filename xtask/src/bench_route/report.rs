//! The decision log's cost lines: on/off ratios of p99 and of CPU per request, and
//! how sure each is.

/// What a measure is and its unit, for the log-cost lines.
pub(super) struct Measure {
    what: &'static str,
    unit: &'static str,
}

pub(super) const P99: Measure = Measure {
    what: "at p99",
    unit: "ms",
};
/// The server's CPU time per request: unlike p99 it barely moves from one run to
/// the next, so it says how much of the p99 ratio is work the log adds rather than
/// noise.
pub(super) const CPU_PER_REQUEST: Measure = Measure {
    what: "in server CPU per request",
    unit: "us",
};

/// The decision log's cost per kind of request: `(log, requests, value)` rows with
/// `plain` and `off` for the same kind give one ratio line.
pub(super) fn print_log_cost(
    backend: &str,
    load: &str,
    measure: &Measure,
    values: &[(&str, &str, f64)],
) {
    for requests in ["one-off", "session"] {
        let of = |log: &str| {
            values
                .iter()
                .find(|(l, r, _)| *l == log && *r == requests)
                .map(|(_, _, value)| *value)
        };
        if let (Some(on), Some(off)) = (of("plain"), of("off")) {
            let Measure { what, unit } = measure;
            println!(
                "{backend}: decision log on/off {what}, {requests}, {load}: {:.2}x ({on:.2} {unit} vs {off:.2} {unit})",
                on / off.max(1e-6)
            );
        }
    }
}

/// [`print_log_cost`] for the median of the rounds, with how sure that ratio is:
/// its 95 % interval ([`median_ratio_interval`]).
/// Two runs' medians differ by more than the log's cost on a small machine; the
/// interval says which differences a run can tell apart from that.
pub(super) fn print_median_log_cost(
    backend: &str,
    load: &str,
    measure: &Measure,
    rounds: &[(&str, &str, Vec<f64>)],
) {
    for requests in ["one-off", "session"] {
        let of = |log: &str| {
            rounds
                .iter()
                .find(|(l, r, _)| *l == log && *r == requests)
                .map(|(_, _, values)| values.as_slice())
        };
        let (Some(on), Some(off)) = (of("plain"), of("off")) else {
            continue;
        };
        let (Some(on_median), Some(off_median)) = (median(on), median(off)) else {
            continue;
        };
        let Measure { what, unit } = measure;
        let sureness = sureness(median_ratio_interval(on, off), 7);
        println!(
            "{backend}: decision log on/off {what}, {requests}, {load}: {:.2}x ({on_median:.2} {unit} vs {off_median:.2} {unit}{sureness})",
            on_median / off_median.max(1e-6)
        );
    }
}

/// The log's cost from pairs of runs made back to back: the median of the rounds'
/// on/off ratios, with its distribution-free 95 % interval ([`median_interval`]).
/// Pairing takes out what drifts between
/// rounds (the machine's slow and fast spells), which the medians of the two
/// settings' rounds ([`print_median_log_cost`]) keep: the same rounds give a narrower
/// interval, narrower still with more of them (with 8 rounds it runs from the
/// smallest ratio to the largest, with 40 from the 14th to the 27th).
pub(super) fn print_paired_log_cost(
    backend: &str,
    rounds: usize,
    paired: &[(&str, &Measure, Vec<f64>)],
) {
    for (requests, measure, ratios) in paired {
        let Some(ratio) = median(ratios) else {
            continue;
        };
        let Measure { what, .. } = measure;
        let sureness = sureness(median_interval(ratios, 0.95), 6);
        println!(
            "{backend}: decision log on/off {what}, {requests}, fixed rate, paired over {rounds} rounds: median ratio {ratio:.2}x{sureness}"
        );
    }
}

/// `; 95 % interval LOWx-HIGHx`, or, with no interval, how many rounds one needs.
fn sureness(interval: Option<(f64, f64)>, min_rounds: usize) -> String {
    match interval {
        Some((low, high)) => format!("; 95 % interval {low:.2}x-{high:.2}x"),
        None => format!("; too few rounds for a 95 % interval: {min_rounds} or more"),
    }
}

/// The upper median, as the rounds' summaries have always taken it.
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied()
}

/// A 95 % interval for `median(on) / median(off)` that assumes nothing about how
/// rounds vary: each median's distribution-free 97.5 % interval
/// ([`median_interval`]), and the ratio from their ends (both hold together with
/// at least 95 %). A percentile bootstrap of a median from 8 rounds was tried first:
/// it came out narrow and contradicted itself from one run to the next (one run
/// "within" the target at 0.53x-0.92x, the next "over" it). `None` when there are too
/// few rounds for the confidence.
fn median_ratio_interval(on: &[f64], off: &[f64]) -> Option<(f64, f64)> {
    let (on_low, on_high) = median_interval(on, 0.975)?;
    let (off_low, off_high) = median_interval(off, 0.975)?;
    Some((on_low / off_high.max(1e-9), on_high / off_low.max(1e-9)))
}

/// The interval between the k-th smallest and k-th largest of `values`, with the
/// largest k for which it holds the median with at least `confidence` (whatever the
/// values' distribution: each value is below the median with probability 1/2). With
/// 8 rounds and 97.5 % that is the smallest and the largest; 3 rounds are too few.
fn median_interval(values: &[f64], confidence: f64) -> Option<(f64, f64)> {
    let n = values.len();
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    // P(Binomial(n, 1/2) <= j), for j = 0, 1, ...
    let mut below = 0.0;
    let mut choose = 1.0;
    let mut k = 0;
    for j in 0..n / 2 {
        if j > 0 {
            choose = choose * (n - j + 1) as f64 / j as f64;
        }
        below += choose * 0.5f64.powi(n as i32);
        // [x(j+1), x(n-j)] misses the median with probability 2 * P(Bin <= j).
        if 1.0 - 2.0 * below < confidence {
            break;
        }
        k = j + 1;
    }
    (k > 0).then(|| (sorted[k - 1], sorted[n - k]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_holds_the_ratio_and_narrows_as_rounds_agree() {
        let off = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 0.8, 1.0];
        let (low, high) = median_ratio_interval(&off, &off).expect("8 rounds");
        assert!(low < 1.0 && high > 1.0, "{low}-{high}");
        // Rounds that agree: a 20 % cost stands out of them.
        let steady = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01];
        let costly: Vec<f64> = steady.iter().map(|v| v * 1.2).collect();
        let (low, high) = median_ratio_interval(&costly, &steady).expect("8 rounds");
        assert!(low > 1.1 && high < 1.3, "{low}-{high}");
        // Three rounds cannot hold a median with 97.5 %.
        assert_eq!(median_ratio_interval(&costly[..3], &steady[..3]), None);
    }

    #[test]
    fn the_median_interval_widens_to_the_confidence_asked() {
        let values: Vec<f64> = (1..=16).map(f64::from).collect();
        // 16 values: [x(4), x(13)] holds the median with 97.9 %, [x(5), x(12)] 92.3 %.
        assert_eq!(median_interval(&values, 0.95), Some((4.0, 13.0)));
        assert_eq!(median_interval(&values, 0.90), Some((5.0, 12.0)));
        assert_eq!(median_interval(&values[..8], 0.975), Some((1.0, 8.0)));
        assert_eq!(median_interval(&values[..8], 0.90), Some((2.0, 7.0)));
        assert_eq!(median_interval(&values[..3], 0.975), None);
    }

    #[test]
    fn paired_rounds_narrow_the_interval_to_the_middle_ratios() {
        let ratios: Vec<f64> = (1..=40).map(f64::from).collect();
        assert_eq!(median_interval(&ratios, 0.95), Some((14.0, 27.0)));
        assert_eq!(median_interval(&ratios[..6], 0.95), Some((1.0, 6.0)));
        assert_eq!(median_interval(&ratios[..5], 0.95), None);
    }

    #[test]
    fn the_median_is_the_upper_one_and_none_of_nothing() {
        assert_eq!(median(&[3.0, 1.0, 2.0, 4.0]), Some(3.0));
        assert_eq!(median(&[]), None);
    }
}
