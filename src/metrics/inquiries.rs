//! The status inquiry's metrics: questions asked of upstreams, by route and
//! what the answer did to the key, the keys waiting for an answer, and the
//! questions this instance is asking now.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A question's route and result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InquiryLabels {
    /// The route's name.
    pub route: String,
    /// `acted` (recorded, replayed from now on), `not_acted` (released),
    /// `unknown` (asked again later) or `gave_up` (held).
    pub result: &'static str,
}

/// `idemgate_inquiries_total`, `idemgate_inquiries_pending` and
/// `idemgate_inquiries_asking`.
#[derive(Debug, Clone, Default)]
pub struct InquiryMetrics {
    /// `idemgate_inquiries_total{route, result}`.
    pub total: Family<InquiryLabels, Counter>,
    /// `idemgate_inquiries_pending`: keys of this instance's routes that
    /// are `inquiring`, whichever instance asks about them (read from the
    /// store each inquirer tick).
    pub pending: Gauge,
    /// `idemgate_inquiries_asking`: keys this instance has taken and not
    /// yet settled (a question on the wire, or about to be).
    pub asking: Gauge,
}

impl InquiryMetrics {
    /// Register them in `registry`.
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "inquiries",
            "Status inquiries (questions to an upstream about an unknown outcome) by route and result",
            self.total.clone(),
        );
        registry.register(
            "inquiries_pending",
            "Keys of this instance's inquiring routes whose outcome is unknown and waits for an answer from their upstream (state inquiring), as the store counts them, whichever instance asks",
            self.pending.clone(),
        );
        registry.register(
            "inquiries_asking",
            "Keys whose outcome this instance is asking its upstream about right now",
            self.asking.clone(),
        );
    }

    /// Count one question's result.
    pub fn count(&self, route: &str, result: &'static str) {
        self.total
            .get_or_create(&InquiryLabels {
                route: route.to_string(),
                result,
            })
            .inc();
    }
}
