package main

import (
	"context"
	"fmt"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/batonhq/baton/aws"
)

// awsAPIClients builds the Auto Scaling and EC2 clients that the instance
// watch and the leader tag share, from the SDK's default configuration
// (AWS_* variables, the shared files, the instance profile), in its region
// or else this instance's (IMDSv2). They retry throttling in the SDK's
// adaptive mode, which slows them down while AWS throttles.
func awsAPIClients(ctx context.Context) (*autoscaling.Client, *ec2.Client, error) {
	cfg, err := awsConfig(ctx)
	if err != nil {
		return nil, nil, err
	}
	retryer := func() sdkaws.Retryer { return retry.NewAdaptiveMode() }
	asg := autoscaling.NewFromConfig(cfg, func(o *autoscaling.Options) { o.Retryer = retryer() })
	ec := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.Retryer = retryer() })
	return asg, ec, nil
}

// awsConfig loads the SDK's default configuration (AWS_* variables, the
// shared files, the instance profile), in its region or else this
// instance's (IMDSv2).
func awsConfig(ctx context.Context) (sdkaws.Config, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return sdkaws.Config{}, fmt.Errorf("loading the AWS configuration (AWS_* variables, ~/.aws/config): %w", err)
	}
	if cfg.Region == "" {
		client := imds.NewFromConfig(cfg, func(o *imds.Options) { o.EnableFallback = sdkaws.FalseTernary })
		out, err := client.GetRegion(ctx, &imds.GetRegionInput{})
		if err != nil {
			return sdkaws.Config{}, fmt.Errorf("%w: set AWS_REGION, or check that the metadata service answers IMDSv2: %w", aws.ErrNoRegion, err)
		}
		cfg.Region = out.Region
	}
	return cfg, nil
}
