//! A test fixture, in test builds only (the `test-hooks` feature): a
//! PaymentIntent as a payments API answers it, about 2 KiB of pretty JSON,
//! the realistic record that the sealing's size and CPU figures are
//! measured on (docs/src/operations/protecting-stored-responses.md#cost).

/// The object, with `marker` in its description and receipt e-mail.
pub fn payment_intent(marker: &str) -> String {
    PAYMENT_INTENT.replace("{marker}", marker)
}

const PAYMENT_INTENT: &str = r#"{
  "amount": 129900,
  "amount_capturable": 0,
  "amount_details": {
    "tip": {}
  },
  "amount_received": 129900,
  "application": null,
  "application_fee_amount": null,
  "automatic_payment_methods": {
    "allow_redirects": "always",
    "enabled": true
  },
  "canceled_at": null,
  "cancellation_reason": null,
  "capture_method": "automatic_async",
  "client_secret": "pi_3OqJ8r2eZvKYlo2C1tY0bQxM_secret_vQk6Wm0zS3nDq8hYbL2pR5tE1",
  "confirmation_method": "automatic",
  "created": 1732867200,
  "currency": "eur",
  "customer": "cus_R2mV8kLq0ZxT4p",
  "description": "Order #100442 for {marker}",
  "id": "pi_3OqJ8r2eZvKYlo2C1tY0bQxM",
  "invoice": null,
  "last_payment_error": null,
  "latest_charge": "ch_3OqJ8r2eZvKYlo2C1z9XkWmA",
  "livemode": false,
  "metadata": {
    "order_id": "100442",
    "cart": "c_88f1e0",
    "channel": "web"
  },
  "next_action": null,
  "object": "payment_intent",
  "on_behalf_of": null,
  "payment_method": "pm_1OqJ8q2eZvKYlo2CkF0hT3uN",
  "payment_method_configuration_details": {
    "id": "pmc_1NsR2v2eZvKYlo2C8dKx0Qb7",
    "parent": null
  },
  "payment_method_options": {
    "card": {
      "installments": null,
      "mandate_options": null,
      "network": null,
      "request_three_d_secure": "automatic"
    },
    "link": {
      "persistent_token": null
    },
    "sepa_debit": {}
  },
  "payment_method_types": [
    "card",
    "link",
    "sepa_debit"
  ],
  "processing": null,
  "receipt_email": "{marker}@example.com",
  "review": null,
  "setup_future_usage": null,
  "shipping": {
    "address": {
      "city": "Lyon",
      "country": "FR",
      "line1": "12 rue de la République",
      "line2": "Bâtiment B",
      "postal_code": "69002",
      "state": null
    },
    "carrier": "Colissimo",
    "name": "Camille Durand",
    "phone": "+33 4 72 00 00 00",
    "tracking_number": "6A12345678901"
  },
  "source": null,
  "statement_descriptor": null,
  "statement_descriptor_suffix": "ORDER 100442",
  "status": "succeeded",
  "transfer_data": null,
  "transfer_group": null
}"#;
