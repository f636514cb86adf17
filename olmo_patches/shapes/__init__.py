"""Pure shape arithmetic, no torch: the papers' closed-form counts of a layer (``counts``), the
hourglass search at a parameter budget (``search``) and paper 2's width schedules and counting rules
(``widths``)."""
