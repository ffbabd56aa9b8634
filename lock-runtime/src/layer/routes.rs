//! What a layer's metrics name each route it serves by (a lock's metrics
//! name for [`LockLayer`](super::LockLayer), the idempotency series'
//! keys for [`IdempotencyLayer`](super::IdempotencyLayer)), made once per
//! route instead of once per request ([`RouteNames`]).

use std::sync::RwLock;

/// How many routes one layer remembers; a layer on more routes than this
/// (on a whole router of many) makes the name of the others per request.
const ROUTES: usize = 64;

/// The metrics names a layer made, by route. A layer sits on a few routes
/// (often one: `route_layer`), so a short list scanned under a read lock
/// costs less than making the name (an allocation) and its series' keys
/// (labels allocated and hashed, per event) again for every request.
#[derive(Debug)]
pub(crate) struct RouteNames<V> {
    names: RwLock<Vec<(Box<str>, V)>>,
}

impl<V> Default for RouteNames<V> {
    fn default() -> Self {
        Self {
            names: RwLock::default(),
        }
    }
}

impl<V: Clone> RouteNames<V> {
    /// The metrics name of `route`, made by `make` the first time.
    pub(crate) fn get(&self, route: &str, make: impl FnOnce(&str) -> V) -> V {
        let known = |names: &[(Box<str>, V)]| {
            names
                .iter()
                .find(|(known, _)| **known == *route)
                .map(|(_, name)| name.clone())
        };
        // A poisoned lock still holds a valid list (pushes do not panic midway).
        let names = self.names.read().unwrap_or_else(|e| e.into_inner());
        if let Some(name) = known(&names) {
            return name;
        }
        drop(names);
        let mut names = self.names.write().unwrap_or_else(|e| e.into_inner());
        if let Some(name) = known(&names) {
            return name;
        }
        let name = make(route);
        if names.len() < ROUTES {
            names.push((route.into(), name.clone()));
        }
        name
    }
}

// Route names differ only with the `metrics` feature (without it a name is
// empty): tests of the crate's own build, under that one feature.
#[cfg(test)]
#[cfg(feature = "metrics")]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::metrics::Name;

    fn name(route: &str) -> Name {
        Name::new(Arc::from(route))
    }

    #[test]
    fn a_route_gets_the_same_name_every_time_and_another_route_its_own() {
        let names = RouteNames::default();
        let first = names.get("/orders/{id}/pay", name);
        assert!(first.same_as(&names.get("/orders/{id}/pay", name)));
        assert!(!first.same_as(&names.get("/orders/{id}", name)));
    }

    #[test]
    fn routes_past_the_bound_still_get_their_names() {
        let names = RouteNames::default();
        for i in 0..ROUTES + 3 {
            names.get(&format!("/r{i}"), name);
        }
        let past = names.get("/past", name);
        assert!(!past.same_as(&names.get("/past", name)));
        assert_eq!(names.names.read().unwrap().len(), ROUTES);
    }
}
