package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/lease"
)

// Exit codes of `tablease admin`.
const (
	exitOK      = 0
	exitFailed  = 1 // the server answered an error, or could not be reached
	exitUsage   = 2 // bad flags or environment; nothing was sent
	exitNothing = 3 // the call worked but found nothing: `lease` of a free session, `revoke` that revoked nothing
)

const adminUsage = `usage: tablease admin <command> [flags]

Calls the admin API of a running tablease over HTTP. The access token (scope lease:admin) is read
from TABLEASE_TOKEN, never from a flag. Every command takes --url (default $TABLEASE_URL or
http://127.0.0.1:8080), --json (print the server's JSON answer as it is) and --timeout (default 30s).

commands:
  leases  [--sub S] [--limit N] [--cursor C]       list the leases held now
  lease   --sub S --sid D                          read one session's lease
  revoke  --sub S --sid D --reason R [--block 5m] [--request-id ID]
                                                   revoke a lease; --block also refuses grants for that long;
                                                   a revoke that may have taken effect without an answer
                                                   prints the command that retries it under its request id
  audit   [--sub S] [--sid D] [--limit N] [--cursor C]   the audit log, newest first (--sid needs --sub)

exit codes:
  0  done
  1  the server answered an error (its code and message are printed) or could not be reached
  2  usage error: bad flags, or TABLEASE_TOKEN unset; nothing was sent
  3  nothing there: lease found the session free, or revoke found no lease to revoke
`

// adminFlags are the flags every admin command takes.
type adminFlags struct {
	url     *string
	json    *bool
	timeout *time.Duration
}

func (p Program) adminFlagSet(name string) (*flag.FlagSet, adminFlags) {
	fs := flag.NewFlagSet("tablease admin "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is one line (parse); --help writes to stdout (Usage)
	fs.Usage = func() { p.writeUsage(fs, "usage: tablease admin "+name+" [flags]") }
	def := p.Getenv("TABLEASE_URL")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	f := adminFlags{
		url:     fs.String("url", def, "base URL of the tablease server ($TABLEASE_URL)"),
		json:    fs.Bool("json", false, "print the JSON answer as it is"),
		timeout: fs.Duration("timeout", 30*time.Second, "bound on the request"),
	}
	return fs, f
}

// usageError is a problem with the command line or the environment: exit 2, nothing sent.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// apiError is an error answer of the server.
type apiError struct {
	Status  int
	Code    string
	Message string
	Details map[string]any
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
	if ms, ok := e.Details["retryAfterMs"].(float64); ok {
		s += fmt.Sprintf(" (retry after %s)", time.Duration(ms)*time.Millisecond)
	}
	if f, ok := e.Details["field"].(string); ok && !strings.Contains(e.Message, f) {
		s += " (field " + f + ")"
	}
	return s
}

func (p Program) admin(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(p.Stderr, adminUsage)
		return exitUsage
	}
	var run func(context.Context, []string) (int, error)
	switch args[0] {
	case "leases":
		run = p.adminLeases
	case "lease":
		run = p.adminLease
	case "revoke":
		run = p.adminRevoke
	case "audit":
		run = p.adminAudit
	case "help", "-h", "--help":
		fmt.Fprint(p.Stdout, adminUsage)
		return exitOK
	default:
		fmt.Fprintf(p.Stderr, "tablease admin: unknown command %q\n\n%s", args[0], adminUsage)
		return exitUsage
	}
	code, err := run(ctx, args[1:])
	var ue *usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(p.Stderr, "tablease admin %s: %s\n", args[0], ue.msg)
		return exitUsage
	case err != nil:
		fmt.Fprintf(p.Stderr, "tablease admin %s: %v\n", args[0], err)
		return exitFailed
	}
	return code
}

// parse parses args into fs and refuses anything left over. --help runs fs.Usage (the flag
// package would run it on a bad flag too, where one line says more).
func parse(fs *flag.FlagSet, args []string) error {
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return err
		}
		return usagef("%v (see --help)", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (every value is a flag; see --help)", fs.Arg(0))
	}
	return nil
}

// adminClient calls the admin API.
type adminClient struct {
	base      *url.URL
	token     string
	http      *http.Client
	requestID string // sent as X-Request-ID when set
}

func (p Program) newAdminClient(f adminFlags) (*adminClient, error) {
	u, err := url.Parse(strings.TrimRight(*f.url, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, usagef("--url must be an http:// or https:// base URL such as http://127.0.0.1:8080 (got %q)", *f.url)
	}
	if u.User != nil {
		return nil, usagef("--url must not carry credentials; the token comes from TABLEASE_TOKEN")
	}
	token := strings.TrimSpace(p.Getenv("TABLEASE_TOKEN"))
	if token == "" {
		return nil, usagef("TABLEASE_TOKEN is not set: export an access token with the scope lease:admin (tablease token --sub you --scope lease:admin)")
	}
	if *f.timeout <= 0 {
		return nil, usagef("--timeout must be positive")
	}
	return &adminClient{base: u, token: token, http: &http.Client{Timeout: *f.timeout}}, nil
}

// do sends one request and returns the body of a 2xx answer, an *apiError for an error answer,
// or an error that says the server could not be reached.
func (c *adminClient) do(ctx context.Context, method string, segments []string, q url.Values, body any) ([]byte, error) {
	u := c.base.JoinPath(segments...)
	if len(q) > 0 {
		u.RawQuery = q.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tablease-cli/"+Version())
	if c.requestID != "" {
		req.Header.Set("X-Request-ID", c.requestID)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) && ue.Timeout() {
			// The request may have reached the server, which may still act on it.
			return nil, fmt.Errorf("no answer from %s within --timeout (%s)", c.base.Redacted(), c.http.Timeout)
		}
		if ue != nil {
			err = ue.Err // the URL is said once, below
		}
		return nil, fmt.Errorf("cannot reach %s: %v", c.base.Redacted(), err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s: %v", c.base.Redacted(), err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if !json.Valid(data) {
			return nil, fmt.Errorf("%s answered %d with something that is not JSON; is --url a tablease server?", c.base.Redacted(), resp.StatusCode)
		}
		return data, nil
	}
	var e struct {
		Error *struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error == nil || e.Error.Code == "" {
		return nil, fmt.Errorf("%s answered %s without a tablease error; is --url a tablease server?", c.base.Redacted(), resp.Status)
	}
	return nil, &apiError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message, Details: e.Error.Details}
}

// fetch is do, then decodes the 2xx answer into out; what names the answer expected ("a lease")
// in the error when it does not fit. It returns the answer as sent, for --json.
func (c *adminClient) fetch(ctx context.Context, method string, segments []string, q url.Values, body, out any, what string) ([]byte, error) {
	data, err := c.do(ctx, method, segments, q, body)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return nil, fmt.Errorf("the answer is not %s: %v", what, err)
	}
	return data, nil
}

// output prints data as it is (--json) or through human.
func (p Program) output(jsonOut bool, data []byte, human func(w io.Writer) error) error {
	if jsonOut {
		data = bytes.TrimRight(data, "\n")
		_, err := fmt.Fprintf(p.Stdout, "%s\n", data)
		return err
	}
	tw := tabwriter.NewWriter(p.Stdout, 0, 4, 2, ' ', 0)
	if err := human(tw); err != nil {
		return err
	}
	return tw.Flush()
}

// The answers, as the CLI reads them.
type cliHolder struct {
	TabID  string `json:"tabId"`
	Label  string `json:"label"`
	Hidden bool   `json:"hidden"`
}

type cliLease struct {
	Sub         string     `json:"sub"`
	SessionID   string     `json:"sessionId"`
	Held        bool       `json:"held"`
	Holder      *cliHolder `json:"holder"`
	Epoch       int64      `json:"epoch"`
	GrantedAt   *string    `json:"grantedAt"`
	ExpiresAt   *string    `json:"expiresAt"`
	TTLMs       int64      `json:"ttlMs"`
	RemainingMs int64      `json:"remainingMs"`
	Transitions int64      `json:"transitions"`
	// BlockedUntil is the end of an admin's block in force; nil when there is none.
	BlockedUntil *string `json:"blockedUntil"`
}

type cliPrevious struct {
	TabID string `json:"tabId"`
	Epoch int64  `json:"epoch"`
}

type cliAuditRecord struct {
	ID        string       `json:"id"`
	At        *string      `json:"at"`
	Sub       string       `json:"sub"`
	SessionID string       `json:"sessionId"`
	Action    string       `json:"action"`
	Epoch     int64        `json:"epoch"`
	TabID     *string      `json:"tabId"`
	Admin     *string      `json:"admin"`
	Previous  *cliPrevious `json:"previous"`
	Reason    *string      `json:"reason"`
	Until     *string      `json:"until"`
	RequestID *string      `json:"requestId"`
}

// clean makes a value from the server safe for a terminal and a table: control characters
// (tabs, newlines, escapes) become U+FFFD.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '\uFFFD'
		}
		return r
	}, s)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return clean(*s)
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func ms(n int64) string {
	return (time.Duration(n) * time.Millisecond).Round(100 * time.Millisecond).String()
}

// shellQuote quotes a value for the "next page" hint.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// again is the command line of "tablease admin <cmd>" run again with the flags this run was given
// (--url, --limit, --sub…), each quoted, and the flag name set to value: the next page (--cursor),
// the retry of a revoke (--request-id).
func again(cmd string, fs *flag.FlagSet, name, value string) string {
	hint := "tablease admin " + cmd
	fs.Visit(func(f *flag.Flag) {
		switch b, isBool := f.Value.(interface{ IsBoolFlag() bool }); {
		case f.Name == name:
		case isBool && b.IsBoolFlag():
			hint += " --" + f.Name
		default:
			hint += " --" + f.Name + " " + shellQuote(clean(f.Value.String()))
		}
	})
	return hint + " --" + name + " " + shellQuote(clean(value))
}

func validID(field, v string, required bool) error {
	if v == "" && !required {
		return nil
	}
	if v == "" {
		return usagef("--%s is required", field)
	}
	if err := lease.ValidateID(field, v); err != nil {
		var ie *lease.InvalidError
		if errors.As(err, &ie) {
			return usagef("--%s %s", field, ie.Reason)
		}
		return usagef("--%s: %v", field, err)
	}
	return nil
}

// limitUsage is the help of --limit.
var limitUsage = fmt.Sprintf("page size, 1 to %d (default: the server's, %d)", lease.MaxPageLimit, lease.DefaultPageLimit)

// pageParams sets the page parameters of q from the flags of fs: --limit, when given, and
// --cursor.
func pageParams(q url.Values, fs *flag.FlagSet, limit int, cursor string) error {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "limit" })
	if given {
		if limit < 1 || limit > lease.MaxPageLimit {
			return usagef("--limit must be from 1 to %d", lease.MaxPageLimit)
		}
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		if len(cursor) > api.MaxCursorLen {
			return usagef("--cursor must be at most %d characters (the nextCursor of an earlier page)", api.MaxCursorLen)
		}
		q.Set("cursor", cursor)
	}
	return nil
}

func (p Program) adminLeases(ctx context.Context, args []string) (int, error) {
	fs, f := p.adminFlagSet("leases")
	sub := fs.String("sub", "", "only this user's leases")
	limit := fs.Int("limit", 0, limitUsage)
	cursor := fs.String("cursor", "", "the nextCursor of the previous page")
	if err := parse(fs, args); err != nil {
		return 0, err
	}
	q := url.Values{}
	if err := validID("sub", *sub, false); err != nil {
		return 0, err
	}
	if *sub != "" {
		q.Set("sub", *sub)
	}
	if err := pageParams(q, fs, *limit, *cursor); err != nil {
		return 0, err
	}
	c, err := p.newAdminClient(f)
	if err != nil {
		return 0, err
	}
	var page struct {
		Leases     []cliLease `json:"leases"`
		NextCursor *string    `json:"nextCursor"`
	}
	data, err := c.fetch(ctx, http.MethodGet, []string{"v1", "admin", "leases"}, q, nil, &page, "a page of leases")
	if err != nil {
		return 0, err
	}
	return exitOK, p.output(*f.json, data, func(w io.Writer) error {
		if len(page.Leases) == 0 {
			fmt.Fprintln(w, "no active leases")
		} else {
			fmt.Fprintln(w, "USER\tSESSION\tHOLDER\tLABEL\tEPOCH\tLEFT\tEXPIRES")
			for _, l := range page.Leases {
				tab, label := "-", ""
				if l.Holder != nil {
					tab, label = clean(l.Holder.TabID), clean(l.Holder.Label)
					if l.Holder.Hidden {
						tab += " (hidden)"
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", clean(l.Sub), clean(l.SessionID), tab, or(label, "-"),
					l.Epoch, ms(l.RemainingMs), or(deref(l.ExpiresAt), "-"))
			}
		}
		if page.NextCursor != nil {
			fmt.Fprintf(w, "\nmore: %s\n", again("leases", fs, "cursor", *page.NextCursor))
		}
		return nil
	})
}

func (p Program) adminLease(ctx context.Context, args []string) (int, error) {
	fs, f := p.adminFlagSet("lease")
	sub := fs.String("sub", "", "the user (required)")
	sid := fs.String("sid", "", "the session (required)")
	if err := parse(fs, args); err != nil {
		return 0, err
	}
	if err := validID("sub", *sub, true); err != nil {
		return 0, err
	}
	if err := validID("sid", *sid, true); err != nil {
		return 0, err
	}
	c, err := p.newAdminClient(f)
	if err != nil {
		return 0, err
	}
	var l cliLease
	data, err := c.fetch(ctx, http.MethodGet, []string{"v1", "admin", "users", *sub, "sessions", *sid, "lease"}, nil, nil, &l, "a lease")
	if err != nil {
		return 0, err
	}
	code := exitOK
	if !l.Held {
		code = exitNothing
	}
	return code, p.output(*f.json, data, func(w io.Writer) error {
		fmt.Fprintf(w, "user\t%s\nsession\t%s\n", clean(l.Sub), clean(l.SessionID))
		if l.Held && l.Holder != nil {
			vis := "visible"
			if l.Holder.Hidden {
				vis = "hidden"
			}
			fmt.Fprintf(w, "held\tyes\nholder\t%s (%s)\nlabel\t%s\n", clean(l.Holder.TabID), vis, or(clean(l.Holder.Label), "-"))
			fmt.Fprintf(w, "epoch\t%d\ngranted at\t%s\nexpires at\t%s\ntime left\t%s\nttl\t%s\n",
				l.Epoch, deref(l.GrantedAt), deref(l.ExpiresAt), ms(l.RemainingMs), ms(l.TTLMs))
		} else {
			fmt.Fprintf(w, "held\tno\nlast epoch\t%d\n", l.Epoch)
			if l.ExpiresAt != nil {
				fmt.Fprintf(w, "ended at\t%s\n", deref(l.ExpiresAt))
			}
		}
		fmt.Fprintf(w, "transitions\t%d\n", l.Transitions)
		if l.BlockedUntil != nil {
			fmt.Fprintf(w, "grants blocked until\t%s\n", deref(l.BlockedUntil))
		}
		return nil
	})
}

// validReason checks the reason with the server's rule (lease.ValidateReason), so that a bad
// reason is a usage error sent nowhere.
func validReason(r string) error {
	if err := lease.ValidateReason(r); err != nil {
		var ie *lease.InvalidError
		if errors.As(err, &ie) {
			return usagef("--reason %s", ie.Reason)
		}
		return usagef("--reason: %v", err)
	}
	return nil
}

func (p Program) adminRevoke(ctx context.Context, args []string) (int, error) {
	fs, f := p.adminFlagSet("revoke")
	sub := fs.String("sub", "", "the user (required)")
	sid := fs.String("sid", "", "the session (required)")
	reason := fs.String("reason", "", "why, at most 200 printable characters (required)")
	block := fs.Duration("block", 0, "also refuse every grant of the session for this long, e.g. 5m (at most the server's TABLEASE_ADMIN_MAX_BLOCK); without it the session is left free, and its open tabs take it again at once")
	requestID := fs.String("request-id", "", "the X-Request-ID that names this revoke (default: a new one); a failed revoke prints the command that retries it with its own")
	if err := parse(fs, args); err != nil {
		return 0, err
	}
	if *requestID == "" {
		*requestID = api.NewRequestID()
	} else if !api.RevokeRequestID(*requestID) {
		return 0, usagef("--request-id must be 1–128 characters of A-Z a-z 0-9 . _ : -, not \".\" or \"..\" (the id a failed revoke printed)")
	}
	if err := validID("sub", *sub, true); err != nil {
		return 0, err
	}
	if err := validID("sid", *sid, true); err != nil {
		return 0, err
	}
	if err := validReason(*reason); err != nil {
		return 0, err
	}
	if *block < 0 || *block%time.Millisecond != 0 {
		return 0, usagef("--block must be a duration of whole milliseconds, not negative, such as 5m")
	}
	c, err := p.newAdminClient(f)
	if err != nil {
		return 0, err
	}
	c.requestID = *requestID
	body := map[string]any{"reason": *reason}
	if *block > 0 {
		body["blockMs"] = block.Milliseconds()
	}
	var res struct {
		Revoked      bool         `json:"revoked"`
		Epoch        int64        `json:"epoch"`
		BlockedUntil *string      `json:"blockedUntil"`
		Previous     *cliPrevious `json:"previous"`
	}
	data, err := c.fetch(ctx, http.MethodPost, []string{"v1", "admin", "users", *sub, "sessions", *sid, "lease", "revoke"}, nil, body, &res, "a revoke result")
	if ae := (*apiError)(nil); err != nil && (!errors.As(err, &ae) || ae.Status >= 500) {
		// The revoke may have taken effect (a timeout, a lost answer, replicas that did not
		// confirm it): a retry under the same id is answered as it was, not revoked again.
		return 0, fmt.Errorf("%w\nto retry this revoke under its id (answered as the revoke was, if it took effect):\n  %s",
			err, again("revoke", fs, "request-id", *requestID))
	}
	if err != nil {
		return 0, err
	}
	code := exitOK
	if !res.Revoked {
		code = exitNothing
	}
	return code, p.output(*f.json, data, func(w io.Writer) error {
		if res.Revoked {
			fmt.Fprintf(w, "revoked %s/%s", *sub, *sid)
			if res.Previous != nil {
				fmt.Fprintf(w, " (held by tab %s at epoch %d)", clean(res.Previous.TabID), res.Previous.Epoch)
			}
			fmt.Fprintf(w, "; new epoch %d\n", res.Epoch)
		} else {
			fmt.Fprintf(w, "nothing to revoke: %s/%s is free (last epoch %d)\n", *sub, *sid, res.Epoch)
		}
		if res.BlockedUntil != nil {
			fmt.Fprintf(w, "grants blocked until %s\n", deref(res.BlockedUntil))
		}
		return nil
	})
}

func (p Program) adminAudit(ctx context.Context, args []string) (int, error) {
	fs, f := p.adminFlagSet("audit")
	sub := fs.String("sub", "", "only this user's records")
	sid := fs.String("sid", "", "only this session's records (needs --sub)")
	limit := fs.Int("limit", 0, limitUsage)
	cursor := fs.String("cursor", "", "the nextCursor of the previous page")
	if err := parse(fs, args); err != nil {
		return 0, err
	}
	if err := validID("sub", *sub, false); err != nil {
		return 0, err
	}
	if err := validID("sid", *sid, false); err != nil {
		return 0, err
	}
	if *sid != "" && *sub == "" {
		return 0, usagef("--sid needs --sub: sessions are named per user")
	}
	q := url.Values{}
	if *sub != "" {
		q.Set("sub", *sub)
	}
	if *sid != "" {
		q.Set("sid", *sid)
	}
	if err := pageParams(q, fs, *limit, *cursor); err != nil {
		return 0, err
	}
	c, err := p.newAdminClient(f)
	if err != nil {
		return 0, err
	}
	var page struct {
		Records    []cliAuditRecord `json:"records"`
		NextCursor *string          `json:"nextCursor"`
	}
	data, err := c.fetch(ctx, http.MethodGet, []string{"v1", "admin", "audit"}, q, nil, &page, "a page of audit records")
	if err != nil {
		return 0, err
	}
	return exitOK, p.output(*f.json, data, func(w io.Writer) error {
		if len(page.Records) == 0 {
			fmt.Fprintln(w, "no audit records")
		} else {
			fmt.Fprintln(w, "TIME\tACTION\tUSER\tSESSION\tEPOCH\tACTOR\tPREVIOUS\tREASON\tUNTIL")
			for _, r := range page.Records {
				actor := "-"
				switch {
				case r.Admin != nil:
					actor = "admin " + deref(r.Admin)
					if r.RequestID != nil { // the id its log lines carry
						actor += " (request " + deref(r.RequestID) + ")"
					}
				case r.TabID != nil:
					actor = "tab " + deref(r.TabID)
				}
				prev := "-"
				if r.Previous != nil {
					prev = fmt.Sprintf("%s@%d", clean(r.Previous.TabID), r.Previous.Epoch)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", or(deref(r.At), "-"), clean(r.Action), clean(r.Sub),
					clean(r.SessionID), r.Epoch, actor, prev, or(deref(r.Reason), "-"), or(deref(r.Until), "-"))
			}
		}
		if page.NextCursor != nil {
			fmt.Fprintf(w, "\nolder: %s\n", again("audit", fs, "cursor", *page.NextCursor))
		}
		return nil
	})
}
