"""What people read, from configs and run folders: parameter counts, the dry-run plan, the papers'
tables and figures, analyses, a sweep's report and the demo's comparison. Imports train, config and
the layers below; nothing imports it but cli and scripts."""
