//! The circles of an import graph: per parent, the modules that all reach
//! each other (strongly connected components of more than one module),
//! each with the shortest cycle through each of its modules.

use std::collections::{BTreeMap, BTreeSet};

use super::imports::{Graph, ModPath};

/// A circle: modules of one parent that all reach each other.
#[derive(Debug)]
pub struct Circle {
    pub parent: ModPath,
    /// Its modules, sorted.
    pub members: Vec<String>,
    /// The shortest cycle through each member (`a -> b -> a`), repeats
    /// left out: together they show each way the circle closes.
    pub cycles: Vec<Vec<String>>,
}

/// The strongly connected components of more than one module, per
/// parent.
pub fn circles(graph: &Graph) -> Vec<Circle> {
    let mut by_parent: BTreeMap<&ModPath, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for edge in graph.edges.keys() {
        by_parent
            .entry(&edge.parent)
            .or_default()
            .entry(&edge.from)
            .or_default()
            .insert(&edge.to);
    }
    let mut found = Vec::new();
    for (parent, next) in by_parent {
        let reach = |from: &str| -> BTreeSet<&str> {
            let mut seen = BTreeSet::new();
            let mut todo = vec![from];
            while let Some(m) = todo.pop() {
                for &n in next.get(m).into_iter().flatten() {
                    if seen.insert(n) {
                        todo.push(n);
                    }
                }
            }
            seen
        };
        let mut done: BTreeSet<&str> = BTreeSet::new();
        for &start in next.keys() {
            if done.contains(start) {
                continue;
            }
            let from_start = reach(start);
            if !from_start.contains(start) {
                continue;
            }
            let members: BTreeSet<&str> = from_start
                .iter()
                .copied()
                .filter(|m| reach(m).contains(start))
                .collect();
            done.extend(members.iter().copied());
            if members.len() < 2 {
                continue;
            }
            let mut cycles: Vec<Vec<String>> = Vec::new();
            for &m in &members {
                let cycle = shortest_cycle(m, &next);
                let mut key = cycle[1..].to_vec();
                key.sort();
                if !cycles.iter().any(|c| {
                    let mut k = c[1..].to_vec();
                    k.sort();
                    k == key
                }) {
                    cycles.push(cycle);
                }
            }
            found.push(Circle {
                parent: parent.clone(),
                members: members.iter().map(|m| (*m).to_owned()).collect(),
                cycles,
            });
        }
    }
    found
}

/// The shortest way from `start` back to itself, `start` at both ends.
fn shortest_cycle(start: &str, next: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<String> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(m) = queue.pop_front() {
        for &n in next.get(m).into_iter().flatten() {
            if n == start {
                let mut path = vec![start.to_owned()];
                let mut at = m;
                while at != start {
                    path.push(at.to_owned());
                    at = came_from[at];
                }
                path.push(start.to_owned());
                path.reverse();
                return path;
            }
            if !came_from.contains_key(n) {
                came_from.insert(n, m);
                queue.push_back(n);
            }
        }
    }
    vec![start.to_owned()]
}
