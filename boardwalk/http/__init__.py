"""The core's HTTP corner: what every API view shares (body parsing, content negotiation,
request ids and limits, list pages, the OpenAPI operation helpers)."""
