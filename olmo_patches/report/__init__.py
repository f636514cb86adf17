"""What people read: parameter counts, the dry-run plan, the papers' tables and figures, benchmarks
and the demo. Imports train, config and the layers below; nothing imports it but cli and scripts."""
