"""The HUD: a static site of the run history (`python -m ci hud --out DIR`).

`read` takes what the pages need from the store, `grid`, `entry_page` and `gpu_use` turn
those rows into what a page shows (pure), `svg` draws the charts, `pages` writes the HTML
and `hud_cli` ties them to the command line. Nothing here writes to the store.
"""
