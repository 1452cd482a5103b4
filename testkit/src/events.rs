//! Counting the library's tracing events for one lock, so a test can wait for something that
//! happens inside the client (a retry, a give-up) instead of guessing how long it takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Counts events whose message contains `needle` and that belong to lock `lock` (the library's
/// events and spans carry the lock name as the `lock` field); an empty `lock` matches any event.
#[derive(Clone)]
pub struct EventCount {
    watch: Arc<Watch>,
}

struct Watch {
    needle: &'static str,
    lock: String,
    count: AtomicU64,
}

static WATCHES: OnceLock<Mutex<Vec<Arc<Watch>>>> = OnceLock::new();

impl EventCount {
    /// Starts counting. The first call installs the process-wide tracing subscriber (which also
    /// prints `RUST_LOG`-selected events, as [`init_tracing`](super::init_tracing) does), so call
    /// it before anything else in the test sets up tracing.
    pub fn watch(needle: &'static str, lock: &str) -> EventCount {
        let watches = WATCHES.get_or_init(|| {
            let subscriber = tracing_subscriber::registry().with(Counter).with(
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(tracing_subscriber::EnvFilter::from_default_env()),
            );
            tracing::subscriber::set_global_default(subscriber)
                .expect("EventCount::watch must run before any other tracing set-up");
            Mutex::new(Vec::new())
        });
        let watch = Arc::new(Watch {
            needle,
            lock: lock.to_owned(),
            count: AtomicU64::new(0),
        });
        watches.lock().unwrap().push(watch.clone());
        EventCount { watch }
    }

    /// Matching events seen so far.
    pub fn get(&self) -> u64 {
        self.watch.count.load(Ordering::SeqCst)
    }
}

/// The `lock` field of a span, kept in its extensions.
struct LockField(String);

struct Counter;

impl<S> Layer<S> for Counter
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut visit = Fields::new("lock");
        attrs.record(&mut visit);
        if let (Some(lock), Some(span)) = (visit.value, ctx.span(id)) {
            span.extensions_mut().insert(LockField(lock));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let Some(watches) = WATCHES.get() else {
            return;
        };
        let mut visit = Fields::new("message");
        event.record(&mut visit);
        let Some(message) = visit.value else {
            return;
        };
        // The event's own `lock` field, else the one of an enclosing span.
        let mut own = Fields::new("lock");
        event.record(&mut own);
        let lock = own.value.or_else(|| {
            ctx.event_scope(event).and_then(|scope| {
                scope
                    .from_root()
                    .find_map(|span| span.extensions().get::<LockField>().map(|l| l.0.clone()))
            })
        });
        let lock = lock.unwrap_or_default();
        for watch in watches.lock().unwrap().iter() {
            if (watch.lock.is_empty() || watch.lock == lock) && message.contains(watch.needle) {
                watch.count.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// Picks one field's value out of a span's or event's fields.
struct Fields {
    name: &'static str,
    value: Option<String>,
}

impl Fields {
    fn new(name: &'static str) -> Fields {
        Fields { name, value: None }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == self.name {
            self.value = Some(format!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == self.name {
            self.value = Some(value.to_owned());
        }
    }
}
