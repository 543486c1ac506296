"""The HTML report: ``gemmlab report DIR... --output report.html`` (collect, svg, html)."""
