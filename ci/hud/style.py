"""The HUD's one style sheet, written beside the pages as hud.css (GitHub's palette)."""

CSS = """\
:root { --pass: #2da44e; --fail: #cf222e; --flaky: #d4a72c; --infra: #8250df;
        --held: #6e7781; --none: #eaeef2; --ink: #1f2328; --muted: #59636e; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--ink);
       margin: 0; padding: 12px 16px 40px; }
header { display: flex; flex-wrap: wrap; gap: 4px 16px; align-items: baseline; }
header h1 { font-size: 20px; margin: 0 8px 0 0; }
nav a { margin-right: 12px; }
a { color: #0969da; }
a:focus-visible, span:focus-visible { outline: 2px solid #0969da; outline-offset: 1px; }
.note { color: var(--muted); max-width: 60em; }
.legend span { display: inline-flex; align-items: center; gap: 4px; margin-right: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 2px; }
.scroll { overflow-x: auto; max-width: 100%; padding-bottom: 150px; margin-bottom: -150px; }
table { border-collapse: collapse; }
/* Wide tables scroll in their own box: the page never scrolls sideways on a phone. */
table.rows { display: block; overflow-x: auto; max-width: 100%; }
table.rows td, table.rows th { border-bottom: 1px solid #d1d9e0; padding: 4px 8px; text-align: left;
                               vertical-align: top; }
table.rows td.reason { max-width: 40em; overflow-wrap: anywhere; }
.grid { table-layout: fixed; }
.grid col.cc { width: 210px; }
.grid col.ce { width: 16px; }
.grid th, .grid td { padding: 0; }
.grid thead th.suite { text-align: left; border-left: 2px solid #fff; background: #f6f8fa;
                       padding: 2px 4px; font-weight: 600; white-space: nowrap;
                       overflow: hidden; text-overflow: ellipsis; }
.grid thead th.e { height: 130px; vertical-align: bottom; }
.grid thead th.e a { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap;
                     font-weight: 400; font-size: 12px; max-height: 128px; overflow: hidden;
                     text-overflow: ellipsis; display: inline-block; }
.grid tbody th { text-align: left; white-space: nowrap; padding-right: 8px; font-weight: 400;
                 font-family: ui-monospace, monospace; font-size: 12px; }
.grid td > :hover, .grid td > :focus { position: relative; }
.grid td > a, .grid td > span { display: block; width: 14px; height: 16px; margin: 1px; }
.pass { background: var(--pass); }
.fail { background: var(--fail); }
.flaky { background: var(--flaky); }
.infra { background: var(--infra); }
.quarantined { background: repeating-linear-gradient(45deg, var(--held) 0 3px, #afb8c1 3px 6px); }
.not-run { background: var(--none); }
.grid td > .first { box-shadow: 0 0 0 2px var(--ink); }
.grid td > .first::before { content: "\\25B2"; display: block; font-size: 9px; line-height: 9px;
                            text-align: center; color: #fff; }
.grid td > :hover::after, .grid td > :focus::after {
  content: attr(aria-label); position: absolute; z-index: 5; left: -1px; top: 18px;
  width: max-content; max-width: min(30em, 80vw); background: var(--ink); color: #fff;
  padding: 4px 6px; border-radius: 4px; font-size: 12px; white-space: pre-wrap; }
.grid tbody tr:hover th { background: #fff8c5; }
.chart { display: block; overflow: visible; }
.chart .axis { stroke: #d1d9e0; }
.chart .tick { font-size: 10px; fill: var(--muted); }
.chart polyline { fill: none; stroke-width: 1.5; }
.s1 { stroke: #0969da; fill: #0969da; color: #0969da; }
.s2 { stroke: #bc4c00; fill: #bc4c00; color: #bc4c00; }
.s3 { stroke: var(--fail); fill: var(--fail); color: var(--fail); }
figure { margin: 8px 16px 8px 0; display: inline-block; vertical-align: top; }
figcaption { font-size: 12px; color: var(--muted); }
.key::before { content: "\\2501  "; }
.bar .track { fill: var(--none); }
.bar .fill { fill: var(--pass); }
.badge { display: inline-block; padding: 0 6px; border-radius: 10px; font-size: 12px; color: #fff; }
.empty { color: var(--muted); }
code { font-family: ui-monospace, monospace; font-size: 12px; overflow-wrap: anywhere; }
@media (max-width: 600px) { body { padding: 8px; } header h1 { font-size: 17px; } }
"""
