"""Great Expectations' Data Docs, served and viewed offline (see the package's docstring)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from tidemark.reconcile.evidence.verdicts import RUN_ID


def data_docs_site(root: Path) -> Path:
    """The Data Docs site ``tidemark.reconcile.expectations`` renders under the reconcile directory."""
    return root / "gx" / "uncommitted" / "data_docs" / "local_site"


def docs_page(site: Path, pipeline: str, run_id: str) -> str | None:
    """A run's validation page in the site (GX: validations/<suite>/<run name>/<time>/<batch>.html),
    as a path relative to the site; None when there is none."""
    if not RUN_ID.match(run_id):
        return None
    found = sorted((site / "validations" / f"tidemark_{pipeline}" / run_id).glob("*/*.html"))
    return found[-1].relative_to(site).as_posix() if found else None


def safe_file(base: Path, path: str) -> Path | None:
    """``path`` (from a URL) inside ``base``, or None: no "..", no absolute path, nothing that
    resolves (symbolic links too) outside ``base``. A folder means its index.html."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if any(p == ".." or "\x00" in p or ":" in p for p in parts) or path.startswith(("/", "\\")):
        return None
    try:
        root = base.resolve(strict=True)
        target = base.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if target != root and root not in target.parents:
        return None
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_SCRIPT = re.compile(r"<script\b[^>]*?\bsrc\s*=\s*([\"'])(?P<url>[^\"']*)\1[^>]*>\s*</script\s*>", re.I)
_LINK = re.compile(r"<link\b[^>]*?\bhref\s*=\s*([\"'])(?P<url>[^\"']*)\1[^>]*>", re.I)
_IMG = re.compile(r"(?P<head><img\b[^>]*?\bsrc\s*=\s*)([\"'])(?P<url>[^\"']*)\2", re.I)
_CSS_URL = re.compile(r"url\(\s*([\"']?)(?P<url>[^\"')]*)\1\s*\)", re.I)
JS, CSS = "tidemark-datadocs.js", "tidemark-datadocs.css"
JS_MARK = "/* Tidemark: the jQuery, Bootstrap and bootstrap-table calls"  # how each asset begins
CSS_MARK = "/* Tidemark: the part of Bootstrap 4 and Font Awesome"


def external(url: str) -> bool:
    """Whether the browser would fetch ``url`` from another machine (http, https or scheme-relative)."""
    u = url.strip()
    if not (u.lower().startswith(("http://", "https://")) or u.startswith("//")):
        return False
    return (urlsplit(u if "://" in u else "http:" + u).hostname or "") not in LOCAL_HOSTS


def offline_html(text: str, assets: str | None, images: str) -> str:
    """A Data Docs page that loads nothing from another machine: its CDN scripts and style sheets
    (jQuery, Bootstrap, bootstrap-table, Font Awesome, Vega) replaced by ``ASSETS``, at ``assets`` (a
    URL prefix ending in /) or, with None, inlined into the page (references to them that
    ``offline_site`` wrote too: a sandboxed page loads no script); GX's logo taken from the site's
    own images at ``images``; other remote images and CSS backgrounds left out. Idempotent."""
    inline = assets is None
    inserted = {JS: JS_MARK in text or (not inline and JS in text), CSS: CSS_MARK in text or (not inline and CSS in text)}

    def replaced(name: str, original: str, url: str) -> str:
        ours = url.rsplit("/", 1)[-1] == name
        if ours and not inline:
            return original
        if not ours and not external(url):
            return original
        if inserted[name] or (name == CSS and not ours and "stylesheet" not in original.lower()):
            return ""
        inserted[name] = True
        if name == JS:
            return f"<script>{DATA_DOCS_JS}</script>" if inline else f'<script src="{assets}{JS}"></script>'
        return f"<style>{ASSETS[CSS][1]}</style>" if inline else f'<link rel="stylesheet" href="{assets}{CSS}">'

    def script(m: re.Match) -> str:
        return replaced(JS, m[0], m["url"])

    def link(m: re.Match) -> str:
        return replaced(CSS, m[0], m["url"])

    def image(m: re.Match) -> str:
        url = m["url"]
        if not external(url):
            return m[0]
        name = urlsplit(url).path.rsplit("/", 1)[-1]
        local = f"{images}{name}" if name in GX_IMAGES else ""
        return f'{m["head"]}"{local}"'

    def css_url(m: re.Match) -> str:
        return "none" if external(m["url"]) else m[0]

    text = _SCRIPT.sub(script, text)
    text = _LINK.sub(link, text)
    text = _IMG.sub(image, text)
    return _CSS_URL.sub(css_url, text)


GX_IMAGES = frozenset({"logo-long.png", "short-logo.png", "favicon.ico", "logo-long-vector.svg",
                       "short-logo-vector.svg"})  # in every site's static/images (GX copies them)


def offline_site(site: Path, run_name: str | None = None) -> list[Path]:
    """Make a rendered Data Docs site viewable offline from disk: ``ASSETS`` written to
    ``static/tidemark/``, and the index, the suite pages and the validation pages of ``run_name``
    (every validation page without one) rewritten by ``offline_html``, each with relative paths.
    Returns the pages rewritten."""
    static = site / "static" / "tidemark"
    static.mkdir(parents=True, exist_ok=True)
    for name, (_, content) in ASSETS.items():
        target = static / name
        if not target.exists() or target.read_text() != content:
            _replace(target, content)
    pages = [site / "index.html", *sorted((site / "expectations").glob("**/*.html"))]
    pages += sorted((site / "validations").glob(f"*/{run_name}/**/*.html" if run_name else "**/*.html"))
    changed = []
    for page in pages:
        try:
            text = page.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        up = os.path.relpath(site / "static", page.parent).replace(os.sep, "/")
        new = offline_html(text, f"{up}/tidemark/", f"{up}/images/")
        if new != text:
            _replace(page, new)
            changed.append(page)
    return changed


def _replace(path: Path, content: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(content)
    os.replace(tmp, path)


def _spacing() -> str:
    """Bootstrap 4's spacing utilities (m-0, pl-md-4, ...), which Data Docs' markup uses throughout."""
    sizes = {"0": "0", "1": ".25rem", "2": ".5rem", "3": "1rem", "4": "1.5rem", "5": "3rem", "auto": "auto"}
    sides = {"": ("",), "t": ("-top",), "b": ("-bottom",), "l": ("-left",), "r": ("-right",),
             "x": ("-left", "-right"), "y": ("-top", "-bottom")}
    out = {"": [], "sm": [], "md": [], "lg": []}
    for prop, letter in (("margin", "m"), ("padding", "p")):
        for side, props in sides.items():
            for size, value in sizes.items():
                if letter == "p" and size == "auto":
                    continue
                for bp in out:
                    name = f"{letter}{side}-{bp + '-' if bp else ''}{size}"
                    out[bp].append(f".{name}{{{';'.join(f'{prop}{p}:{value}!important' for p in props)}}}")
    media = {"sm": 576, "md": 768, "lg": 992}
    return "\n".join(out[""]) + "".join(f"\n@media (min-width:{media[bp]}px){{{''.join(out[bp])}}}"
                                        for bp in ("sm", "md", "lg"))


def _columns() -> str:
    rules = {"": [], "sm": [], "md": [], "lg": []}
    for bp in rules:
        for n in range(1, 13):
            name = f"col-{bp + '-' if bp else ''}{n}"
            rules[bp].append(f".{name}{{flex:0 0 {n / 12 * 100:.4f}%;max-width:{n / 12 * 100:.4f}%}}")
    for bp in ("", "sm", "md", "lg"):
        infix = f"{bp}-" if bp else ""
        rules[bp] += [f".d-{infix}none{{display:none!important}}", f".d-{infix}block{{display:block!important}}",
                      f".d-{infix}flex{{display:flex!important}}", f".d-{infix}inline-flex{{display:inline-flex!important}}",
                      f".d-{infix}inline-block{{display:inline-block!important}}",
                      f".d-{infix}inline{{display:inline!important}}", f".flex-{infix}row{{flex-direction:row!important}}",
                      f".flex-{infix}column{{flex-direction:column!important}}"]
    media = {"sm": 576, "md": 768, "lg": 992}
    return "\n".join(rules[""]) + "".join(f"\n@media (min-width:{media[bp]}px){{{''.join(rules[bp])}}}"
                                          for bp in ("sm", "md", "lg"))


DATA_DOCS_CSS = """/* Tidemark: the part of Bootstrap 4 and Font Awesome that Great Expectations' Data Docs use,
   so that they read offline (their pages load both from CDNs). */
*,::after,::before{box-sizing:border-box}
body{margin:0;font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;font-size:14px;line-height:1.5;
color:#212529;background:#fff}
a{color:#0056b3;text-decoration:none}a:hover{text-decoration:underline}
h1,h2,h3,h4,h5,h6,.h6{margin-top:0;margin-bottom:.5rem;font-weight:500;line-height:1.2}
h6,.h6{font-size:1rem}p{margin-top:0;margin-bottom:1rem}.lead{font-size:1.15rem;font-weight:300}
code{font-size:87.5%;color:#c7254e;word-break:break-word}pre{white-space:pre-wrap}
ul,ol{margin-top:0}.list-unstyled{padding-left:0;list-style:none}
.container-fluid{width:100%;padding-left:15px;padding-right:15px;margin-left:auto;margin-right:auto}
.row{display:flex;flex-wrap:wrap;margin-left:-15px;margin-right:-15px}
[class*="col-"],.col{position:relative;width:100%;padding-left:15px;padding-right:15px}.col{flex:1 0 0%}
.w-100{width:100%!important}.h-100{height:100%!important}.mw-100{max-width:100%!important}
.float-left{float:left!important}.float-right{float:right!important}
.flex-wrap{flex-wrap:wrap!important}.flex-column{flex-direction:column!important}
.justify-content-center{justify-content:center!important}.justify-content-between{justify-content:space-between!important}
.align-items-center{align-items:center!important}.mr-auto{margin-right:auto!important}.ml-auto{margin-left:auto!important}
.text-center{text-align:center!important}.text-right{text-align:right!important}.text-left{text-align:left!important}
.text-success{color:#28a745!important}.text-danger{color:#dc3545!important}.text-warning{color:#b58105!important}
.text-info{color:#17a2b8!important}.text-muted,.text-secondary{color:#6c757d!important}.text-white{color:#fff!important}
.font-weight-bold{font-weight:700!important}.font-italic{font-style:italic!important}.small,small{font-size:80%}
.bg-light{background-color:#f8f9fa!important}.bg-white{background-color:#fff!important}
.border{border:1px solid #dee2e6!important}.border-bottom{border-bottom:1px solid #dee2e6!important}
.border-top{border-top:1px solid #dee2e6!important}.border-info{border-color:#17a2b8!important}
.rounded{border-radius:.25rem!important}.rounded-0{border-radius:0!important}.shadow-sm{box-shadow:0 .125rem .25rem rgba(0,0,0,.075)}
.sticky,.sticky-top{position:sticky;top:0;z-index:1020}.fixed-bottom{position:fixed;right:0;bottom:0;left:0;z-index:1030}
.invisible{visibility:hidden!important}.collapse:not(.show){display:none}.fade:not(.show){opacity:0}
.modal,.modal-backdrop{display:none!important}.tab-content>.tab-pane{display:none}.tab-content>.active{display:block}
.navbar{position:relative;display:flex;flex-wrap:wrap;align-items:center;justify-content:space-between;padding:.5rem 1rem;
background:#fff}.navbar-brand{display:inline-block;margin-right:1rem}
.nav{display:flex;flex-wrap:wrap;padding-left:0;margin-bottom:0;list-style:none}.nav-link{display:block;padding:.4rem .8rem}
.nav-pills .nav-link.active{color:#fff;background:#007bff;border-radius:.25rem}.nav-item{list-style:none}
.breadcrumb{display:flex;flex-wrap:wrap;padding:.5rem 1rem;margin-bottom:1rem;list-style:none;border-radius:.25rem}
.breadcrumb-item+.breadcrumb-item{padding-left:.5rem}.breadcrumb-item+.breadcrumb-item::before{content:"/";padding-right:.5rem;color:#6c757d}
.card{position:relative;display:flex;flex-direction:column;background:#fff;border:1px solid rgba(0,0,0,.125);border-radius:.25rem}
.card-header{padding:.6rem 1rem;background:rgba(0,0,0,.03);border-bottom:1px solid rgba(0,0,0,.125)}.card-body{flex:1 1 auto;padding:1rem}
.alert{position:relative;padding:.75rem 1.25rem;margin-bottom:1rem;border:1px solid transparent;border-radius:.25rem}
.alert-secondary{color:#383d41;background:#e2e3e5;border-color:#d6d8db}.alert-info{color:#0c5460;background:#d1ecf1;border-color:#bee5eb}
.alert-danger{color:#721c24;background:#f8d7da}.alert-success{color:#155724;background:#d4edda}
.alert-heading{color:inherit}.close{float:right;font-size:1.5rem;line-height:1;background:none;border:0;cursor:pointer}
.badge{display:inline-block;padding:.25em .4em;font-size:75%;font-weight:700;line-height:1;border-radius:.25rem;white-space:nowrap}
.badge-secondary{color:#fff;background:#6c757d}.badge-info{color:#fff;background:#17a2b8}.badge-success{color:#fff;background:#28a745}
.badge-danger{color:#fff;background:#dc3545}.badge-warning{color:#212529;background:#ffc107}.badge-primary{color:#fff;background:#007bff}
.btn{display:inline-block;padding:.3rem .7rem;font-size:.9rem;line-height:1.5;border:1px solid transparent;border-radius:.25rem;
cursor:pointer;background:#f8f9fa;color:#212529;text-align:center}.btn-sm{padding:.2rem .5rem;font-size:.8rem}
.btn-primary{color:#fff;background:#007bff;border-color:#007bff}.btn-secondary{color:#fff;background:#6c757d;border-color:#6c757d}
.btn-info{color:#fff;background:#17a2b8}.btn-outline-info{color:#17a2b8;border-color:#17a2b8;background:#fff}
.btn-group,.btn-group-toggle{display:inline-flex}
.table{width:100%;margin-bottom:1rem;border-collapse:collapse;color:#212529}
.table td,.table th{padding:.5rem;vertical-align:top;border-top:1px solid #dee2e6;text-align:left}
.table thead th{vertical-align:bottom;border-bottom:2px solid #dee2e6}.table-sm td,.table-sm th{padding:.3rem}
.table-bordered td,.table-bordered th{border:1px solid #dee2e6}.table-responsive{display:block;width:100%;overflow-x:auto}
.table-striped tbody tr:nth-of-type(odd){background:rgba(0,0,0,.03)}.tm-table tbody tr:hover{background:#f1f5fb}
.tm-search{margin:.25rem 0 .5rem;padding:.25rem .5rem;border:1px solid #ced4da;border-radius:.25rem;min-width:16rem}
.fas,.far,.fa,.fab{display:inline-block;font-style:normal;font-variant:normal;line-height:1}
.fa-check-circle::before{content:"\\2714"}.fa-check::before{content:"\\2713"}.fa-times::before{content:"\\2716"}
.fa-times-circle::before{content:"\\2716"}.fa-question-circle::before{content:"?"}.fa-exclamation-triangle::before{content:"\\26A0"}
.fa-comment::before{content:"\\1F4AC"}.fa-info-circle::before{content:"\\2139"}.fa-angle-down::before{content:"\\25BE"}
.fa-angle-up::before{content:"\\25B4"}.fa-search::before{content:"\\1F50D"}.fa-bars::before{content:"\\2630"}
#ge-cta-footer{display:none!important}
"""


DATA_DOCS_JS = r"""/* Tidemark: the jQuery, Bootstrap and bootstrap-table calls Great Expectations' Data Docs make,
   so that their pages render offline (they load those libraries from CDNs). Tables are drawn from the
   data each page embeds, with a search box and sortable columns; charts (Vega) are not drawn. */
(function (w, d) {
  "use strict";
  var NATIVE = ["click", "change", "input", "keyup", "keydown", "submit", "mouseover", "mouseout", "focus", "blur"];
  function List(nodes) {
    this.length = 0;
    for (var i = 0; i < nodes.length; i++) { if (nodes[i]) { this[this.length++] = nodes[i]; } }
  }
  function arr(list) { return Array.prototype.slice.call(list); }
  function ready(f) {
    if (d.readyState === "loading") { d.addEventListener("DOMContentLoaded", function () { f($); }); }
    else { setTimeout(function () { f($); }, 0); }
  }
  function $(sel) {
    if (sel instanceof List) { return sel; }
    if (typeof sel === "function") { ready(sel); return new List([d]); }
    if (typeof sel === "string") {
      var s = sel.trim();
      if (s.charAt(0) === "<") { var t = d.createElement("template"); t.innerHTML = s; return new List(arr(t.content.childNodes)); }
      try { return new List(arr(d.querySelectorAll(s))); } catch (e) { return new List([]); }
    }
    if (sel && (sel.nodeType || sel === w)) { return new List([sel]); }
    if (sel && typeof sel.length === "number") { return new List(arr(sel)); }
    return new List([]);
  }
  var fn = List.prototype;
  fn.each = function (f) { for (var i = 0; i < this.length; i++) { f.call(this[i], i, this[i]); } return this; };
  fn.get = function (i) { return i === undefined ? arr(this) : this[i]; };
  fn.eq = function (i) { return new List([this[i]]); };
  fn.first = function () { return this.eq(0); };
  fn.ready = function (f) { ready(f); return this; };
  fn.on = function (events, selector, f) {
    if (typeof selector === "function") { f = selector; selector = null; }
    var list = this;
    events.split(/\s+/).forEach(function (ev) {
      var type = ev.split(".")[0];
      if (!type) { return; }
      list.each(function (i, el) {
        if (NATIVE.indexOf(type) >= 0 && el.addEventListener) {
          el.addEventListener(type, function (e) {
            if (!selector || (e.target.closest && e.target.closest(selector))) { f.call(el, e); }
          });
        } else {
          el.__tmOn = el.__tmOn || {};
          (el.__tmOn[type] = el.__tmOn[type] || []).push(f);
        }
      });
    });
    return this;
  };
  fn.trigger = function (type, args) {
    var t = type.split(".")[0];
    return this.each(function (i, el) {
      ((el.__tmOn || {})[t] || []).forEach(function (f) { f.apply(el, [{type: t, target: el}].concat(args || [])); });
    });
  };
  fn.click = function (f) { return f ? this.on("click", f) : this.each(function (i, el) { el.click(); }); };
  function classes(list, c, how) {
    return list.each(function (i, el) { String(c || "").split(/\s+/).forEach(function (x) { if (x) { el.classList[how](x); } }); });
  }
  fn.addClass = function (c) { return classes(this, c, "add"); };
  fn.removeClass = function (c) { return classes(this, c, "remove"); };
  fn.toggleClass = function (c) { return classes(this, c, "toggle"); };
  fn.hasClass = function (c) { return this.length > 0 && this[0].classList.contains(c); };
  fn.attr = function (k, v) {
    if (v === undefined) { return this.length ? this[0].getAttribute(k) : undefined; }
    return this.each(function (i, el) { el.setAttribute(k, v); });
  };
  fn.data = function (k) {
    if (!this.length || !this[0].getAttribute) { return undefined; }
    var v = this[0].getAttribute("data-" + k);
    return v === null ? undefined : v;
  };
  fn.show = fn.fadeIn = fn.slideDown = function () {
    return this.each(function (i, el) { el.style.display = ""; if (getComputedStyle(el).display === "none") { el.style.display = "block"; } });
  };
  fn.hide = fn.fadeOut = fn.slideUp = function () { return this.each(function (i, el) { el.style.display = "none"; }); };
  fn.toggle = function () {
    return this.each(function (i, el) { if (getComputedStyle(el).display === "none") { $(el).show(); } else { $(el).hide(); } });
  };
  fn.parent = function () {
    var out = [];
    this.each(function (i, el) { if (el.parentElement && out.indexOf(el.parentElement) < 0) { out.push(el.parentElement); } });
    return new List(out);
  };
  fn.closest = function (s) {
    var out = [];
    this.each(function (i, el) { var c = el.closest && el.closest(s); if (c && out.indexOf(c) < 0) { out.push(c); } });
    return new List(out);
  };
  fn.find = function (s) {
    var out = [];
    this.each(function (i, el) { arr(el.querySelectorAll(s)).forEach(function (n) { if (out.indexOf(n) < 0) { out.push(n); } }); });
    return new List(out);
  };
  function insert(list, content, where) {
    return list.each(function (i, el) {
      if (typeof content === "string") { el.insertAdjacentHTML(where, content); }
      else { $(content).each(function (j, n) { el.insertAdjacentElement(where, n); }); }
    });
  }
  fn.prepend = function (c) { return insert(this, c, "afterbegin"); };
  fn.append = function (c) { return insert(this, c, "beforeend"); };
  fn.html = function (h) {
    if (h === undefined) { return this.length ? this[0].innerHTML : undefined; }
    return this.each(function (i, el) { el.innerHTML = h; });
  };
  fn.text = function (t) {
    if (t === undefined) { return this.length ? this[0].textContent : undefined; }
    return this.each(function (i, el) { el.textContent = t; });
  };
  fn.val = function (v) {
    if (v === undefined) { return this.length ? this[0].value : undefined; }
    return this.each(function (i, el) { el.value = v; });
  };
  fn.css = function (k, v) {
    if (typeof k === "string" && v === undefined) { return this.length ? getComputedStyle(this[0])[k] : undefined; }
    var props = typeof k === "string" ? {} : k;
    if (typeof k === "string") { props[k] = v; }
    return this.each(function (i, el) { Object.keys(props).forEach(function (p) { el.style[p] = props[p]; }); });
  };
  fn.modal = fn.tooltip = fn.popover = fn.dropdown = fn.alert = fn.button = function () { return this; };
  fn.collapse = function (how) {
    return this.each(function (i, el) {
      el.classList.toggle("show", how === "show" ? true : how === "hide" ? false : !el.classList.contains("show"));
    });
  };
  fn.tab = function () {
    return this.each(function (i, el) {
      var target = d.querySelector(el.getAttribute("href") || el.getAttribute("data-target"));
      if (!target) { return; }
      arr(target.parentNode.children).forEach(function (p) { p.classList.remove("active", "show"); });
      target.classList.add("active", "show");
      var nav = el.closest(".nav");
      if (nav) { arr(nav.querySelectorAll(".active")).forEach(function (a) { a.classList.remove("active"); }); }
      el.classList.add("active");
    });
  };

  function named(f) { return typeof f === "function" ? f : (typeof f === "string" && typeof w[f] === "function" ? w[f] : null); }
  function yes(v) { return v === true || v === "true"; }
  function plain(h) { var t = d.createElement("div"); t.innerHTML = h === null || h === undefined ? "" : String(h); return (t.textContent || "").trim(); }
  function esc(s) { var t = d.createElement("div"); t.textContent = s === null || s === undefined ? "" : String(s); return t.innerHTML; }
  function draw(table) {
    var o = table.__tmTable, cols = o.columns || [], q = (o.searchText || "").toLowerCase();
    var rows = (o.data || []).filter(function (row) {
      return !q || cols.some(function (c) { return plain(row[c.field]).toLowerCase().indexOf(q) >= 0; });
    });
    var col = null;
    cols.forEach(function (c) { if (c.field === o.sortName) { col = c; } });
    var key = (col && col.sortName) || o.sortName;
    if (key) {
      var dir = o.sortOrder === "desc" ? -1 : 1;
      rows = rows.slice().sort(function (a, b) {
        var x = a[key], y = b[key];
        if (typeof x !== "number" || typeof y !== "number") { x = plain(x); y = plain(y); }
        return x < y ? -dir : x > y ? dir : 0;
      });
    }
    table.innerHTML = "<thead><tr>" + cols.map(function (c, i) {
      var mark = c.field === o.sortName ? (o.sortOrder === "desc" ? " \u25BE" : " \u25B4") : "";
      return '<th data-tm-col="' + i + '"' + (yes(c.sortable) ? ' style="cursor:pointer"' : "") + ">" + esc(c.title || c.field) + mark + "</th>";
    }).join("") + "</tr></thead><tbody></tbody>";
    var body = table.tBodies[0], attributes = named(o.rowAttributes), style = named(o.rowStyle);
    if (!rows.length) { body.innerHTML = '<tr><td colspan="' + Math.max(cols.length, 1) + '">No matching records found</td></tr>'; }
    rows.forEach(function (row, i) {
      var tr = d.createElement("tr"), attrs = attributes ? attributes(row, i) || {} : {}, css = style ? (style(row, i) || {}).css || {} : {};
      Object.keys(attrs).forEach(function (k) { if (attrs[k] !== null && attrs[k] !== undefined) { tr.setAttribute(k, attrs[k]); } });
      Object.keys(css).forEach(function (k) { tr.style[k] = css[k]; });
      cols.forEach(function (c) {
        var td = d.createElement("td");
        if (c.align) { td.style.textAlign = c.align; }
        td.innerHTML = row[c.field] === null || row[c.field] === undefined ? "" : String(row[c.field]);
        tr.appendChild(td);
      });
      tr.addEventListener("click", function (e) { if (!(e.target.closest && e.target.closest("a"))) { $(table).trigger("click-row", [row, $(tr)]); } });
      body.appendChild(tr);
    });
    arr(table.tHead.rows[0].cells).forEach(function (th) {
      var c = cols[+th.getAttribute("data-tm-col")];
      if (!c || !yes(c.sortable)) { return; }
      th.addEventListener("click", function () {
        o.sortOrder = o.sortName === c.field && o.sortOrder !== "desc" ? "desc" : "asc";
        o.sortName = c.field;
        draw(table);
      });
    });
  }
  fn.bootstrapTable = function (options) {
    return this.each(function (i, table) {
      if (typeof options === "string") {
        if (table.__tmTable && (options === "resetSearch" || options === "clearFilterControl")) {
          table.__tmTable.searchText = "";
          if (table.__tmSearch) { table.__tmSearch.value = ""; }
          draw(table);
        }
        return;
      }
      table.__tmTable = Object.assign({}, options || {});
      table.classList.add("table", "table-sm", "tm-table");
      if (yes(table.__tmTable.search) && !table.__tmSearch) {
        var box = d.createElement("input");
        box.type = "search";
        box.placeholder = "Search";
        box.className = "tm-search";
        box.addEventListener("input", function () { table.__tmTable.searchText = box.value; draw(table); });
        table.__tmSearch = box;
        table.parentNode.insertBefore(box, table);
      }
      draw(table);
    });
  };
  $.fn = fn;
  $.extend = Object.assign;
  $.each = function (o, f) { Object.keys(o).forEach(function (k) { f.call(o[k], k, o[k]); }); return o; };
  w.jQuery = w.$ = $;
  w.vegaEmbed = function (el) {
    var n = typeof el === "string" ? d.querySelector(el) : el;
    if (n) { n.textContent = "(chart not drawn: Data Docs offline)"; }
    return Promise.resolve({});
  };
  d.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target.closest("[data-toggle],[data-dismiss]") : null;
    if (!t) { return; }
    var toggle = t.getAttribute("data-toggle");
    if (toggle === "collapse") {
      e.preventDefault();
      var sel = t.getAttribute("data-target") || t.getAttribute("href");
      if (sel) { $(sel).collapse(); }
    } else if (toggle === "tab" || toggle === "pill") {
      e.preventDefault();
      $(t).tab();
    }
    if (t.getAttribute("data-dismiss") === "alert") {
      var a = t.closest(".alert");
      if (a) { a.parentNode.removeChild(a); $(a).trigger("closed"); }
    }
  });
})(window, document);
"""


ASSETS: dict[str, tuple[str, str]] = {
    JS: ("text/javascript", DATA_DOCS_JS),
    CSS: ("text/css", DATA_DOCS_CSS + _columns() + "\n" + _spacing() + "\n"),
}
