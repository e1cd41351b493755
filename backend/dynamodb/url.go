package dynamodb

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/batonhq/baton"
)

// URLForm shows how a dynamodb:// URL is written, for messages.
const URLForm = "dynamodb://TABLE[?region=REGION&profile=PROFILE&endpoint=URL&poll=DURATION]"

// The query parameters of a dynamodb:// URL. Each is optional: the SDK's
// usual resolution (AWS_REGION, AWS_PROFILE, ~/.aws/config, the instance
// or task role, AWS_ENDPOINT_URL_DYNAMODB) fills in what the URL leaves out.
const (
	ParamRegion   = "region"   // the AWS region: eu-west-1
	ParamProfile  = "profile"  // a profile of ~/.aws/config
	ParamEndpoint = "endpoint" // an endpoint URL (a VPC endpoint, an emulator)
	ParamPoll     = "poll"     // Options.PollInterval: 2s
)

// URL is a parsed dynamodb:// URL.
type URL struct {
	// Table is the URL's host: the table's name.
	Table string
	// Region, Profile and Endpoint are the parameters of the same names,
	// "" when absent.
	Region, Profile, Endpoint string
	// Poll is the poll parameter, zero when absent.
	Poll time.Duration
}

// ParseURL parses raw, dynamodb://TABLE with optional parameters (see
// URLForm), without connecting. Its error names what is wrong and shows
// the form.
func ParseURL(raw string) (URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return URL{}, fmt.Errorf("dynamodb: %v: use %s", err, URLForm)
	}
	if !strings.EqualFold(u.Scheme, "dynamodb") {
		return URL{}, fmt.Errorf("dynamodb: scheme %q: use %s", u.Scheme, URLForm)
	}
	if u.Opaque != "" {
		return URL{}, fmt.Errorf("dynamodb: %q has no //: use %s", raw, URLForm)
	}
	if u.User != nil {
		return URL{}, fmt.Errorf("dynamodb: credentials do not go in the URL (argv is readable by every local user): use AWS_PROFILE, the instance role or the environment; %s", URLForm)
	}
	if u.Port() != "" || strings.HasSuffix(u.Host, ":") {
		return URL{}, fmt.Errorf("dynamodb: %q has a port: the host is the table's name; an emulator's address goes in ?endpoint= (%s)", u.Host, URLForm)
	}
	if u.Path != "" && u.Path != "/" {
		return URL{}, fmt.Errorf("dynamodb: unexpected path %q: the table is the host, dynamodb://TABLE (%s)", u.Path, URLForm)
	}
	if u.Fragment != "" {
		return URL{}, fmt.Errorf("dynamodb: unexpected fragment %q (%s)", u.Fragment, URLForm)
	}
	out := URL{Table: u.Host}
	if err := CheckTableName(out.Table); err != nil {
		return URL{}, fmt.Errorf("dynamodb: %v (%s)", err, URLForm)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return URL{}, fmt.Errorf("dynamodb: query: %v (%s)", err, URLForm)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return URL{}, fmt.Errorf("dynamodb: parameter %q given %d times (%s)", k, len(vs), URLForm)
		}
		v := vs[0]
		switch k {
		case ParamRegion:
			if v == "" || strings.ContainsAny(v, "/ :") {
				return URL{}, fmt.Errorf("dynamodb: region %q: want a region such as eu-west-1 (%s)", v, URLForm)
			}
			out.Region = v
		case ParamProfile:
			if v == "" {
				return URL{}, fmt.Errorf("dynamodb: empty profile (%s)", URLForm)
			}
			out.Profile = v
		case ParamEndpoint:
			e, err := url.Parse(v)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return URL{}, fmt.Errorf("dynamodb: endpoint %q: want an http:// or https:// URL, %%-escaped in the query (%s)", v, URLForm)
			}
			out.Endpoint = v
		case ParamPoll:
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return URL{}, fmt.Errorf("dynamodb: poll %q: want a positive duration such as 2s (%s)", v, URLForm)
			}
			out.Poll = d
		default:
			return URL{}, fmt.Errorf("dynamodb: unknown parameter %q: the parameters are %s, %s, %s and %s (%s)", k, ParamRegion, ParamProfile, ParamEndpoint, ParamPoll, URLForm)
		}
	}
	return out, nil
}

// Client returns a DynamoDB client for u, by the SDK's usual resolution of
// region, credentials and endpoint, overridden by u's parameters. A
// missing region is a *baton.ConfigError.
func (u URL) Client(ctx context.Context) (*dynamodb.Client, error) {
	var opts []func(*config.LoadOptions) error
	if u.Region != "" {
		opts = append(opts, config.WithRegion(u.Region))
	}
	if u.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(u.Profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, &baton.ConfigError{Problems: []string{"dynamodb: load the AWS configuration: " + err.Error()}}
	}
	if cfg.Region == "" {
		return nil, &baton.ConfigError{Problems: []string{"dynamodb: no AWS region: set AWS_REGION, a profile's region, or ?region= in the URL (" + URLForm + ")"}}
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if u.Endpoint != "" {
			o.BaseEndpoint = aws.String(u.Endpoint)
		}
	}), nil
}
