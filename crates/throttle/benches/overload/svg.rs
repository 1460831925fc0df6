//! The experiment's figure: goodput, CRITICAL success and admitted p99
//! per load and throttler, as a hand-written SVG (no plotting dependency).

use std::fmt::Write as _;

use super::{Mode, Row};

pub fn svg(rows: &[Row], unloaded_p99: f64) -> String {
    let (w, h) = (900.0, 330.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let charts = [
        ("Goodput (% of capacity)", 0usize, 100.0),
        ("CRITICAL success (%)", 1, 100.0),
        (
            "Admitted p99 latency (ms)",
            2,
            rows.iter()
                .map(|r| r.p99_ms)
                .filter(|x| x.is_finite())
                .fold(unloaded_p99 * 2.0, f64::max),
        ),
    ];
    let colors = ["#9e9e9e", "#4f81bd", "#c0504d"];
    let modes = [Mode::None, Mode::Qps, Mode::Cost];
    let loads = [1.0, 2.0, 4.0];
    for (ci, (title, metric, max)) in charts.iter().enumerate() {
        let x0 = 40.0 + ci as f64 * 290.0;
        let (cw, ch, y0) = (240.0, 220.0, 40.0);
        let _ = write!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-weight="bold">{title}</text>"#,
            x0 + cw / 2.0
        );
        let _ = write!(
            s,
            r#"<line x1="{x0}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
            y0 + ch,
            x0 + cw,
            y0 + ch
        );
        let _ = write!(
            s,
            r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="black"/>"#,
            y0 + ch
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{max:.0}</text>"#,
            x0 - 3.0,
            y0 + 4.0
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
            x0 - 3.0,
            y0 + ch
        );
        if *metric == 2 {
            let y = y0 + ch - (unloaded_p99 * 2.0 / max) * ch;
            let _ = write!(
                s,
                r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#2e7d32" stroke-dasharray="4 3"/><text x="{}" y="{}" fill="#2e7d32">2× unloaded p99</text>"##,
                x0 + cw,
                x0 + 4.0,
                y - 3.0
            );
        }
        for (li, load) in loads.iter().enumerate() {
            let gx = x0 + 10.0 + li as f64 * 78.0;
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{load}×</text>"#,
                gx + 30.0,
                y0 + ch + 15.0
            );
            for (mi, mode) in modes.iter().enumerate() {
                let Some(r) = rows.iter().find(|r| r.mode == *mode && r.load == *load) else {
                    continue;
                };
                let v = match metric {
                    0 => r.goodput * 100.0,
                    1 => r.critical_success * 100.0,
                    _ => r.p99_ms,
                };
                let v = if v.is_finite() { v.min(*max) } else { 0.0 };
                let bh = v / max * ch;
                let _ = write!(
                    s,
                    r#"<rect x="{}" y="{}" width="18" height="{bh:.1}" fill="{}"/>"#,
                    gx + mi as f64 * 20.0,
                    y0 + ch - bh,
                    colors[mi]
                );
            }
        }
    }
    for (mi, mode) in modes.iter().enumerate() {
        let x = 40.0 + mi as f64 * 140.0;
        let _ = write!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            h - 30.0,
            colors[mi],
            x + 16.0,
            h - 20.0,
            mode.name()
        );
    }
    s.push_str("</svg>\n");
    s
}
