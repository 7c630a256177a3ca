"""xmr readme-section: paste generated Markdown tables into a marked section of README.md."""

HELP = "replace the <!-- xmr:NAME --> ... <!-- /xmr:NAME --> section of README.md (or a docs page) with generated files"


def add_arguments(p):
    p.add_argument("parts", nargs="+", help="Markdown files, concatenated in this order; a .png is copied to "
                                            "--figure-dir and shown as an image")
    p.add_argument("--section", required=True, help="section name, e.g. results-synth")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--out", help="also write the section's text here")
    p.add_argument("--figure-dir", default="docs/img", help="where .png parts are copied (committed with the page)")


def run(args):
    from xmr.report.readme import update_section

    update_section(args.readme, args.section, args.parts, args.out, args.figure_dir)
    print(f"updated section {args.section} of {args.readme} from {len(args.parts)} file(s)")
