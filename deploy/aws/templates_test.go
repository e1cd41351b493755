// Package aws holds the AWS deployment templates of baton-lambda; its tests
// check their structure with no AWS account and no external validator.
package aws

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"gopkg.in/yaml.v3"
)

const (
	samTemplate = "baton-lambda/template.yaml"
	tfDir       = "baton-lambda/terraform"
	tfMain      = tfDir + "/main.tf"
)

// lambdaActions lists the IAM actions of the calls baton-lambda makes: the
// EC2 and Auto Scaling calls in cmd/baton-lambda and the item calls of
// backend/dynamodb (opened with NoCheck, so no DescribeTable). The test
// checks this list against the code as well as against the templates.
var lambdaActions = []string{
	"autoscaling:DescribeAutoScalingGroups",
	"dynamodb:BatchGetItem",
	"dynamodb:GetItem",
	"dynamodb:PutItem",
	"dynamodb:UpdateItem",
	"ec2:CreateTags",
	"ec2:DeleteTags",
	"ec2:DescribeTags",
}

// TestLeastActionsMatchCode reads the calls baton-lambda makes on its AWS
// clients and checks that lambdaActions is exactly their IAM actions.
func TestLeastActionsMatchCode(t *testing.T) {
	got := map[string]bool{}
	scan := func(dir string, re *regexp.Regexp, service func([]string) string) {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || filepath.Base(f) == "table.go" || filepath.Base(f) == "limit.go" {
				// table.go is create-table and the check NoCheck skips;
				// limit.go forwards the same calls.
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range re.FindAllStringSubmatch(string(src), -1) {
				got[service(m)+":"+m[len(m)-1]] = true
			}
		}
	}
	scan("cmd/baton-lambda", regexp.MustCompile(`\be\.(asg|ec2)\.(\w+)\(`), func(m []string) string {
		if m[1] == "asg" {
			return "autoscaling"
		}
		return "ec2"
	})
	scan("backend/dynamodb", regexp.MustCompile(`\.(?:db|direct)\.(\w+)\(`), func([]string) string { return "dynamodb" })
	var actions []string
	for a := range got {
		actions = append(actions, a)
	}
	sort.Strings(actions)
	if !slices.Equal(actions, lambdaActions) {
		t.Fatalf("baton-lambda calls %v; the templates are checked against %v", actions, lambdaActions)
	}
}

// cfnValue converts a YAML node to plain Go values, turning CloudFormation's
// short-form intrinsic tags (!Ref, !GetAtt, !Sub, ...) into their long form.
func cfnValue(t reporter, n *yaml.Node) any {
	t.Helper()
	var v any
	switch n.Kind {
	case yaml.DocumentNode:
		return cfnValue(t, n.Content[0])
	case yaml.AliasNode:
		return cfnValue(t, n.Alias)
	case yaml.MappingNode:
		m := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			m[n.Content[i].Value] = cfnValue(t, n.Content[i+1])
		}
		v = m
	case yaml.SequenceNode:
		var s []any
		for _, c := range n.Content {
			s = append(s, cfnValue(t, c))
		}
		v = s
	case yaml.ScalarNode:
		if strings.HasPrefix(n.Tag, "!!") || n.Tag == "" {
			var x any
			if err := n.Decode(&x); err != nil {
				t.Fatalf("line %d: %v", n.Line, err)
			}
			return x
		}
		v = n.Value
	}
	switch {
	case strings.HasPrefix(n.Tag, "!!") || n.Tag == "":
		return v
	case n.Tag == "!Ref" || n.Tag == "!Condition":
		return map[string]any{n.Tag[1:]: v}
	case n.Tag == "!GetAtt":
		if s, ok := v.(string); ok {
			parts := strings.SplitN(s, ".", 2)
			return map[string]any{"Fn::GetAtt": []any{parts[0], parts[len(parts)-1]}}
		}
		return map[string]any{"Fn::GetAtt": v}
	case strings.HasPrefix(n.Tag, "!"):
		return map[string]any{"Fn::" + n.Tag[1:]: v}
	}
	t.Fatalf("line %d: unknown YAML tag %s", n.Line, n.Tag)
	return nil
}

func m(t reporter, v any, path string) map[string]any {
	t.Helper()
	x, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: want a mapping, got %T", path, v)
	}
	return x
}

func strs(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var s []string
		for _, e := range x {
			if str, ok := e.(string); ok {
				s = append(s, str)
			}
		}
		return s
	}
	return nil
}

// knownCFNTypes are the resource types the SAM template may use.
var knownCFNTypes = []string{"AWS::DynamoDB::Table", "AWS::SNS::Topic", "AWS::Serverless::Function"}

// TestSAMTemplateStructure parses the SAM template and checks the function,
// its triggers and its least-privilege policy.
func TestSAMTemplateStructure(t *testing.T) {
	src, err := os.ReadFile(samTemplate)
	if err != nil {
		t.Fatal(err)
	}
	checkSAM(t, src)
}

func checkSAM(t reporter, src []byte) {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatalf("%s: %v", samTemplate, err)
	}
	root := m(t, cfnValue(t, &doc), "template")
	if root["AWSTemplateFormatVersion"] != "2010-09-09" || root["Transform"] != "AWS::Serverless-2016-10-31" {
		t.Errorf("want AWSTemplateFormatVersion 2010-09-09 and the SAM transform, got %v, %v", root["AWSTemplateFormatVersion"], root["Transform"])
	}
	params := m(t, root["Parameters"], "Parameters")
	resources := m(t, root["Resources"], "Resources")
	var fn map[string]any
	for name, r := range resources {
		typ, _ := m(t, r, name)["Type"].(string)
		if !slices.Contains(knownCFNTypes, typ) {
			t.Errorf("resource %s: Type %q is not one of %v", name, typ, knownCFNTypes)
		}
		if typ == "AWS::Serverless::Function" {
			fn = m(t, m(t, r, name)["Properties"], name+".Properties")
		}
	}
	if fn == nil {
		t.Fatalf("no AWS::Serverless::Function")
	}
	if fn["Runtime"] != "provided.al2023" || fn["Handler"] != "bootstrap" {
		t.Errorf("Runtime %v Handler %v, want provided.al2023 and bootstrap", fn["Runtime"], fn["Handler"])
	}
	if fn["ReservedConcurrentExecutions"] != 1 {
		t.Errorf("ReservedConcurrentExecutions = %v, want 1", fn["ReservedConcurrentExecutions"])
	}
	archs, _ := fn["Architectures"].([]any)
	if len(archs) != 1 {
		t.Fatalf("Architectures = %v, want one", fn["Architectures"])
	}
	ref, _ := m(t, archs[0], "Architectures[0]")["Ref"].(string)
	p := m(t, params[ref], "Parameters."+ref)
	if allowed := strs(p["AllowedValues"]); !slices.Equal(allowed, []string{"arm64", "x86_64"}) || p["Default"] != "arm64" {
		t.Errorf("architecture parameter %s allows %v default %v, want [arm64 x86_64] default arm64", ref, allowed, p["Default"])
	}

	events := m(t, fn["Events"], "Events")
	kinds := map[string]map[string]any{}
	for name, e := range events {
		em := m(t, e, name)
		typ, _ := em["Type"].(string)
		kinds[typ] = m(t, em["Properties"], name+".Properties")
	}
	if kinds["SNS"] == nil || kinds["SNS"]["Topic"] == nil {
		t.Errorf("no SNS event with a Topic")
	}
	if eb := kinds["EventBridgeRule"]; eb == nil || !slices.Contains(strs(m(t, eb["Pattern"], "Pattern")["source"]), "aws.autoscaling") {
		t.Errorf("no EventBridgeRule event for source aws.autoscaling")
	}
	if s := kinds["Schedule"]; s == nil || s["Schedule"] != "rate(1 minute)" {
		t.Errorf("want a Schedule event rate(1 minute), got %v", s)
	}

	var stmts []statement
	policies, _ := fn["Policies"].([]any)
	for i, pol := range policies {
		doc := m(t, pol, "Policies")
		list, _ := doc["Statement"].([]any)
		for _, s := range list {
			sm := m(t, s, "Statement")
			st := statement{sid: strs(sm["Sid"]), actions: strs(sm["Action"]), conditions: map[string]string{}}
			if sm["Effect"] != "Allow" || sm["NotAction"] != nil {
				t.Errorf("policy %d: statement %v: want Effect Allow and Action only", i, sm["Sid"])
			}
			if c, ok := sm["Condition"].(map[string]any); ok {
				for op, vars := range c {
					for k := range m(t, vars, "Condition."+op) {
						st.conditions[k] = op
					}
				}
			}
			stmts = append(stmts, st)
		}
	}
	checkStatements(t, "template.yaml", stmts, nil)
}

type statement struct {
	sid        []string
	actions    []string
	conditions map[string]string // condition key -> operator
}

// checkStatements checks that the statements grant exactly lambdaActions
// (plus extra), never dynamodb:DeleteItem or a wildcard, that every
// DynamoDB action is under dynamodb:LeadingKeys, and that the tag writes
// are limited to the group and the leader's tag keys.
func checkStatements(t reporter, where string, stmts []statement, extra []string) {
	t.Helper()
	granted := map[string]bool{}
	for _, s := range stmts {
		for _, a := range s.actions {
			granted[a] = true
			if strings.Contains(a, "*") || a == "dynamodb:DeleteItem" {
				t.Errorf("%s: statement %v grants %s", where, s.sid, a)
			}
			if strings.HasPrefix(a, "dynamodb:") && s.conditions["dynamodb:LeadingKeys"] != "ForAllValues:StringLike" {
				t.Errorf("%s: statement %v grants %s without a ForAllValues:StringLike dynamodb:LeadingKeys condition", where, s.sid, a)
			}
			if (a == "ec2:CreateTags" || a == "ec2:DeleteTags") && (s.conditions["aws:TagKeys"] == "" || s.conditions["aws:ResourceTag/aws:autoscaling:groupName"] == "") {
				t.Errorf("%s: statement %v grants %s without aws:TagKeys and group conditions", where, s.sid, a)
			}
		}
	}
	var got []string
	for a := range granted {
		got = append(got, a)
	}
	sort.Strings(got)
	want := append(slices.Clone(lambdaActions), extra...)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s grants %v, want exactly %v", where, got, want)
	}
}

// TestSAMTemplateCheckFailsOnBrokenTemplate checks that checkSAM rejects
// a template with a DeleteItem grant or without the LeadingKeys condition.
func TestSAMTemplateCheckFailsOnBrokenTemplate(t *testing.T) {
	src, err := os.ReadFile(samTemplate)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(string) string{
		"DeleteItem": func(s string) string {
			return strings.Replace(s, "- dynamodb:PutItem", "- dynamodb:PutItem\n                - dynamodb:DeleteItem", 1)
		},
		"no LeadingKeys": func(s string) string {
			return strings.Replace(s, "dynamodb:LeadingKeys:", "dynamodb:Attributes:", 1)
		},
		"runtime": func(s string) string {
			return strings.Replace(s, "provided.al2023", "go1.x", 1)
		},
		"concurrency": func(s string) string {
			return strings.Replace(s, "ReservedConcurrentExecutions: 1", "ReservedConcurrentExecutions: 2", 1)
		},
		"schedule": func(s string) string {
			return strings.Replace(s, "rate(1 minute)", "rate(5 minutes)", 1)
		},
		"wildcard": func(s string) string {
			return strings.Replace(s, "- dynamodb:PutItem", "- dynamodb:*", 1)
		},
	} {
		broken := edit(string(src))
		if broken == string(src) {
			t.Fatalf("%s: edit changed nothing", name)
		}
		if r := record(func(r reporter) { checkSAM(r, []byte(broken)) }); len(r) == 0 {
			t.Errorf("%s: checkSAM accepted the broken template", name)
		} else {
			t.Logf("%s: %s", name, r[0])
		}
	}
}

// TestCFNShortFormTags checks that the short-form intrinsic tags read as
// their long form.
func TestCFNShortFormTags(t *testing.T) {
	var doc yaml.Node
	src := "a: !Ref Table\nb: !GetAtt Table.Arn\nc: !Sub \"${X}-token\"\nd: !GetAtt [Table, Arn]\ne: 1\n"
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	got := cfnValue(t, &doc).(map[string]any)
	want := map[string]any{
		"a": map[string]any{"Ref": "Table"},
		"b": map[string]any{"Fn::GetAtt": []any{"Table", "Arn"}},
		"c": map[string]any{"Fn::Sub": "${X}-token"},
		"d": map[string]any{"Fn::GetAtt": []any{"Table", "Arn"}},
		"e": 1,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v, want %#v", got, want)
	}
}

// reporter is the part of *testing.T the checks use, so that a test can
// run them on a broken template and see them fail.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

type recorder struct{ msgs []string }

type stop struct{}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	panic(stop{})
}

// record runs check and returns the failures it reported.
func record(check func(reporter)) []string {
	r := &recorder{}
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(stop); !ok {
					panic(p)
				}
			}
		}()
		check(r)
	}()
	return r.msgs
}

// knownTFTypes are the resource and data source types main.tf may use.
var knownTFTypes = []string{
	"aws_autoscaling_notification", "aws_cloudwatch_event_rule", "aws_cloudwatch_event_target",
	"aws_cloudwatch_log_group", "aws_dynamodb_table", "aws_iam_role", "aws_iam_role_policy",
	"aws_lambda_function", "aws_lambda_permission", "aws_sns_topic", "aws_sns_topic_subscription",
	// data sources
	"aws_caller_identity", "aws_iam_policy_document", "aws_partition", "aws_region",
}

// TestTerraformStructure parses main.tf with HCL and checks the same facts
// as TestSAMTemplateStructure on its aws_* resources.
func TestTerraformStructure(t *testing.T) {
	src, err := os.ReadFile(tfMain)
	if err != nil {
		t.Fatal(err)
	}
	checkTF(t, src)
}

// literal evaluates attr with no variables: a literal, or cty.NilVal.
func literal(body *hclsyntax.Body, name string) (cty.Value, bool) {
	a, ok := body.Attributes[name]
	if !ok {
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		return cty.NilVal, false
	}
	return v, true
}

func literalStrings(body *hclsyntax.Body, name string) []string {
	v, ok := literal(body, name)
	if !ok || !(v.Type().IsTupleType() || v.Type().IsListType()) {
		return nil
	}
	var s []string
	for it := v.ElementIterator(); it.Next(); {
		_, e := it.Element()
		if e.Type() == cty.String && e.IsKnown() {
			s = append(s, e.AsString())
		}
	}
	return s
}

func literalString(body *hclsyntax.Body, name string) string {
	v, ok := literal(body, name)
	if !ok || v.Type() != cty.String {
		return ""
	}
	return v.AsString()
}

func checkTF(t reporter, src []byte) {
	t.Helper()
	f, diags := hclparse.NewParser().ParseHCL(src, tfMain)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", tfMain, diags)
	}
	body := f.Body.(*hclsyntax.Body)
	blocks := map[string]*hclsyntax.Body{} // "resource.TYPE.NAME" -> body
	byType := map[string][]*hclsyntax.Body{}
	for _, b := range body.Blocks {
		switch b.Type {
		case "resource", "data":
			if len(b.Labels) != 2 {
				t.Fatalf("%s %v: want two labels", b.Type, b.Labels)
			}
			if !slices.Contains(knownTFTypes, b.Labels[0]) {
				t.Errorf("%s %s: type is not one of %v", b.Type, b.Labels[0], knownTFTypes)
			}
			blocks[b.Type+"."+b.Labels[0]+"."+b.Labels[1]] = b.Body
			byType[b.Labels[0]] = append(byType[b.Labels[0]], b.Body)
		case "variable":
			blocks["variable."+b.Labels[0]] = b.Body
		}
	}
	fns := byType["aws_lambda_function"]
	if len(fns) != 1 {
		t.Fatalf("want one aws_lambda_function, got %d", len(fns))
	}
	fn := fns[0]
	if literalString(fn, "runtime") != "provided.al2023" || literalString(fn, "handler") != "bootstrap" {
		t.Errorf("aws_lambda_function: runtime %q handler %q, want provided.al2023 and bootstrap", literalString(fn, "runtime"), literalString(fn, "handler"))
	}
	if v, ok := literal(fn, "reserved_concurrent_executions"); !ok || !v.Type().Equals(cty.Number) || !v.Equals(cty.NumberIntVal(1)).True() {
		t.Errorf("aws_lambda_function: reserved_concurrent_executions is not 1")
	}
	arch := blocks["variable.architecture"]
	if a, ok := fn.Attributes["architectures"]; !ok || arch == nil || !strings.Contains(string(a.Expr.Range().SliceBytes(src)), "var.architecture") {
		t.Errorf("aws_lambda_function: architectures must be [var.architecture]")
	} else {
		var cond string
		for _, b := range arch.Blocks {
			if b.Type == "validation" {
				cond = string(b.Body.Attributes["condition"].Expr.Range().SliceBytes(src))
			}
		}
		if literalString(arch, "default") != "arm64" || cond != `contains(["arm64", "x86_64"], var.architecture)` {
			t.Errorf("variable architecture: default %q validation %q, want arm64 and arm64/x86_64 only", literalString(arch, "default"), cond)
		}
	}

	var schedule, autoscaling bool
	for _, r := range byType["aws_cloudwatch_event_rule"] {
		if literalString(r, "schedule_expression") == "rate(1 minute)" {
			schedule = true
		}
		if a, ok := r.Attributes["event_pattern"]; ok && strings.Contains(string(a.Expr.Range().SliceBytes(src)), `"aws.autoscaling"`) {
			autoscaling = true
		}
	}
	if !schedule || !autoscaling {
		t.Errorf("want an event rule rate(1 minute) (%v) and one for source aws.autoscaling (%v)", schedule, autoscaling)
	}
	if len(byType["aws_cloudwatch_event_target"]) < 2 || len(byType["aws_sns_topic_subscription"]) != 1 || len(byType["aws_autoscaling_notification"]) != 1 {
		t.Errorf("want two event targets, an SNS subscription and the group's notification")
	}
	var sns bool
	for _, s := range byType["aws_sns_topic_subscription"] {
		sns = literalString(s, "protocol") == "lambda"
	}
	if !sns {
		t.Errorf("the SNS subscription's protocol is not lambda")
	}

	doc := blocks["data.aws_iam_policy_document.function"]
	pol := blocks["resource.aws_iam_role_policy.function"]
	if doc == nil || pol == nil || !strings.Contains(string(pol.Attributes["policy"].Expr.Range().SliceBytes(src)), "data.aws_iam_policy_document.function.json") {
		t.Fatalf("want aws_iam_role_policy.function with data.aws_iam_policy_document.function")
	}
	var stmts []statement
	for _, b := range doc.Blocks {
		if b.Type != "statement" {
			continue
		}
		if e := literalString(b.Body, "effect"); e != "" && e != "Allow" {
			t.Errorf("statement %s: effect %s", literalString(b.Body, "sid"), e)
		}
		if _, ok := b.Body.Attributes["not_actions"]; ok {
			t.Errorf("statement %s: not_actions", literalString(b.Body, "sid"))
		}
		st := statement{sid: []string{literalString(b.Body, "sid")}, actions: literalStrings(b.Body, "actions"), conditions: map[string]string{}}
		if _, ok := b.Body.Attributes["actions"]; ok && st.actions == nil {
			t.Errorf("statement %s: actions must be a literal list", st.sid)
		}
		for _, c := range b.Body.Blocks {
			if c.Type == "condition" {
				st.conditions[literalString(c.Body, "variable")] = literalString(c.Body, "test")
			}
		}
		stmts = append(stmts, st)
	}
	checkStatements(t, "main.tf", stmts, []string{"logs:CreateLogStream", "logs:PutLogEvents"})
}

// TestTerraformCheckFailsOnBrokenTemplate checks that checkTF rejects a
// main.tf with a DeleteItem grant or without the LeadingKeys condition.
func TestTerraformCheckFailsOnBrokenTemplate(t *testing.T) {
	src, err := os.ReadFile(tfMain)
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(string) string{
		"DeleteItem": func(s string) string {
			return strings.Replace(s, `["dynamodb:PutItem"]`, `["dynamodb:PutItem", "dynamodb:DeleteItem"]`, 1)
		},
		"no LeadingKeys": func(s string) string { return strings.Replace(s, `"dynamodb:LeadingKeys"`, `"dynamodb:Attributes"`, 1) },
		"runtime":        func(s string) string { return strings.Replace(s, `"provided.al2023"`, `"go1.x"`, 1) },
		"concurrency": func(s string) string {
			return strings.Replace(s, "reserved_concurrent_executions = 1", "reserved_concurrent_executions = 2", 1)
		},
		"schedule": func(s string) string { return strings.Replace(s, "rate(1 minute)", "rate(5 minutes)", 1) },
		"unknown type": func(s string) string {
			return strings.Replace(s, `resource "aws_sns_topic" `, `resource "aws_sns_topics" `, 1)
		},
	} {
		broken := edit(string(src))
		if broken == string(src) {
			t.Fatalf("%s: edit changed nothing", name)
		}
		if r := record(func(r reporter) { checkTF(r, []byte(broken)) }); len(r) == 0 {
			t.Errorf("%s: checkTF accepted the broken main.tf", name)
		} else {
			t.Logf("%s: %s", name, r[0])
		}
	}
}

// TestTemplateValidators runs the templates' own validators, cfn-lint and
// terraform, when BATON_TEMPLATE_VALIDATORS=1; a validator missing from
// PATH then fails the test. terraform init and validate need the AWS
// provider from the registry, so they run only with
// BATON_TEMPLATE_VALIDATORS=network.
func TestTemplateValidators(t *testing.T) {
	mode := os.Getenv("BATON_TEMPLATE_VALIDATORS")
	if mode == "" {
		t.Skip("set BATON_TEMPLATE_VALIDATORS=1 to run cfn-lint and terraform fmt (=network adds terraform init and validate)")
	}
	run := func(dir string, name string, args ...string) {
		t.Helper()
		path, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("BATON_TEMPLATE_VALIDATORS is set but %s is not on PATH: %v", name, err)
		}
		cmd := exec.Command(path, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "TF_DATA_DIR="+t.TempDir(), "TF_IN_AUTOMATION=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
		}
		t.Logf("%s %s: ok", name, strings.Join(args, " "))
	}
	run(filepath.Dir(samTemplate), "cfn-lint", filepath.Base(samTemplate))
	run(tfDir, "terraform", "fmt", "-check", "-diff")
	if mode == "network" {
		run(tfDir, "terraform", "init", "-backend=false", "-input=false")
		run(tfDir, "terraform", "validate")
	}
}
