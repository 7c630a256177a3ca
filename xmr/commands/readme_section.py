"""xmr readme-section: paste generated Markdown tables into a marked section of README.md."""

HELP = "replace the <!-- xmr:NAME --> ... <!-- /xmr:NAME --> section of README.md with generated Markdown files"


def add_arguments(p):
    p.add_argument("parts", nargs="+", help="Markdown files, concatenated in this order")
    p.add_argument("--section", required=True, help="section name, e.g. results-synth")
    p.add_argument("--readme", default="README.md")
    p.add_argument("--out", help="also write the section's text here")


def run(args):
    from xmr.report.readme import update_section

    update_section(args.readme, args.section, args.parts, args.out)
    print(f"updated section {args.section} of {args.readme} from {len(args.parts)} file(s)")
