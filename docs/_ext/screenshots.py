"""Regenerate the PNGs in docs/screenshots/ from the built documentation site.

Run by hand from the repository root, after a change that alters what the
pages look like:

    python -m pip install weasyprint pypdfium2
    python docs/_ext/screenshots.py
    python docs/_ext/screenshots.py --site /tmp/site   # a site already built

Without --site the script first builds the site into a temporary directory
(`mkdocs build --strict`, which needs the `dev` extra). WeasyPrint and
pypdfium2 are needed only here: they are not dependencies of the package or
of its `dev` extra (written against WeasyPrint 70 and pypdfium2 5).

No browser is used. WeasyPrint lays each page out as print (HTML and CSS to
PDF, the first page of `--width` x `--height` CSS pixels) and pypdfium2
rasterizes that first page at one image pixel per CSS pixel; the blank space
below the last line is trimmed and the image is stored with a 256-color
palette (a third of the size; no pixel moves by more than a few levels). So the screenshots show
the site's print layout, not what a browser window shows:
- no JavaScript runs (the material theme's pages read without it);
- the theme's print stylesheet applies: no header bar, navigation,
  table of contents or search box, the content spans the page, code wraps
  instead of scrolling, header anchors and copy buttons are hidden;
- three rules are overridden so that the print layout reads like the
  screen's: the theme's screen text size (0.8rem, not print's 0.68rem), page
  margins of our own, and the main column as a block (WeasyPrint cannot
  break the theme's full-height flex box across pages and leaves the first
  page blank);
- only local files are read (the site's own CSS and images): the Roboto
  web fonts are not fetched, so the text is in the system's fallback fonts.
"""

import argparse
import logging
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

# PNG file name -> the page of the built site it shows.
PAGES = {
    "home.png": "index.html",
    "guide_your_data.png": "your_data/index.html",
    "api_layers.png": "api/layers/index.html",
    "api_models.png": "api/models/index.html",  # BertConfig: defaults as values
}

# User stylesheet: `!important` so that it wins over the theme's rules.
OVERRIDES = """
@page {{ size: {width}px {height}px; margin: 40px 56px !important; }}
.md-main__inner {{ display: block !important; height: auto !important;
                   margin-top: 0 !important; }}
.md-typeset {{ font-size: .8rem !important; }}
"""


def render_top(html_path, width, height, bottom_margin=40):
    """The top of `html_path` as a PIL image, `width` pixels wide and at
    most `height` tall, trimmed below the last non-white row."""
    import pypdfium2
    import weasyprint
    from PIL import ImageOps

    document = weasyprint.HTML(
        filename=str(html_path),
        url_fetcher=weasyprint.URLFetcher(allowed_protocols=("file", "data")),
    ).render(stylesheets=[weasyprint.CSS(
        string=OVERRIDES.format(width=width, height=height))])
    pdf = pypdfium2.PdfDocument(document.copy(document.pages[:1]).write_pdf())
    page = pdf[0]
    image = page.render(scale=width / page.get_width()).to_pil().convert("RGB")
    pdf.close()
    # Rows that hold anything darker than near-white.
    ink = ImageOps.invert(image.convert("L")).point(lambda v: 255 if v > 8 else 0)
    box = ink.getbbox()
    if box is None:
        raise SystemExit(f"{html_path}: the first page rendered blank")
    bottom = min(image.height, box[3] + bottom_margin)
    return image.crop((0, 0, image.width, bottom))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=pathlib.Path,
                        help="a built site (default: build one into a temporary directory)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--width", type=int, default=1280, help="page width, CSS pixels")
    parser.add_argument("--height", type=int, default=1200, help="page height, CSS pixels")
    args = parser.parse_args(argv)
    from PIL import Image
    # WeasyPrint warns about each CSS property it does not know (the theme
    # has many) and each refused web font.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory() as temporary:
        site = args.site
        if site is None:
            site = pathlib.Path(temporary) / "site"
            subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                            "--site-dir", str(site)], cwd=ROOT, check=True)
        args.out.mkdir(parents=True, exist_ok=True)
        for name, page in PAGES.items():
            html_path = site / page
            if not html_path.is_file():
                raise SystemExit(f"{html_path}: no such page in the built site")
            image = render_top(html_path, args.width, args.height)
            image = image.quantize(colors=256, method=Image.Quantize.MAXCOVERAGE,
                                   dither=Image.Dither.NONE)
            image.save(args.out / name, optimize=True)
            print(f"{args.out / name}: {image.width}x{image.height} from {page}")


if __name__ == "__main__":
    main()
