//! Order statistics: medians across rounds and nearest-rank percentiles of samples.

/// The median of `values` (the mean of the two middle ones for an even count); `NaN` when
/// empty. NaN inputs are ignored.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The nearest-rank `p`-th percentile (0 < p <= 100) of `values`: the smallest value with at
/// least p % of the samples at or below it. With fewer than 100 samples the 99th percentile is
/// the maximum. `NaN` when empty.
pub(crate) fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Smallest and largest value (`NaN`s when empty).
pub(crate) fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold((f64::NAN, f64::NAN), |(lo, hi), x| {
            (
                if lo.is_nan() { x } else { lo.min(x) },
                if hi.is_nan() { x } else { hi.max(x) },
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[5.0, 1.0, 9.0], 99.0), 9.0);
        assert_eq!(percentile(&[5.0], 50.0), 5.0);
    }

    #[test]
    fn min_and_max() {
        assert_eq!(min_max(&[2.0, 7.0, 1.0]), (1.0, 7.0));
        assert!(min_max(&[]).0.is_nan());
    }
}
